//! The admin commands' connection and output flags (`--address`,
//! `--token`, `--namespace`, `--ca-cert`, `-o`) may come anywhere: before
//! the command group (`composer --address X run list`) as well as after
//! the command. Clap takes them where each command declares them, so the
//! ones written before the command are moved to the end of the line.

use std::ffi::OsString;

/// Flags that take a value and belong to every admin command.
const VALUED: [&str; 5] = [
    "--address",
    "--token",
    "--namespace",
    "--ca-cert",
    "--output",
];
/// Their short forms.
const SHORT_VALUED: [&str; 1] = ["-o"];

/// `args` (the program name first) with the client flags written before
/// the command moved after it. Scanning stops at the first other flag:
/// what follows it may be any value, even one that looks like a flag.
pub fn hoist(args: Vec<OsString>) -> Vec<OsString> {
    let mut kept = Vec::with_capacity(args.len());
    let mut hoisted = Vec::new();
    let mut rest = args.into_iter();
    if let Some(program) = rest.next() {
        kept.push(program);
    }
    while let Some(arg) = rest.next() {
        let Some(text) = arg.to_str() else {
            kept.push(arg);
            break;
        };
        match client_flag(text) {
            Some(Takes::Value) => {
                hoisted.push(arg);
                if let Some(value) = rest.next() {
                    hoisted.push(value);
                }
            }
            Some(Takes::Inline) => hoisted.push(arg),
            None if text.starts_with('-') => {
                kept.push(arg);
                break;
            }
            None => kept.push(arg),
        }
    }
    kept.extend(rest);
    kept.extend(hoisted);
    kept
}

enum Takes {
    /// The value is the next argument.
    Value,
    /// The value is in this one (`--address=X`, `-ojson`).
    Inline,
}

fn client_flag(text: &str) -> Option<Takes> {
    if VALUED.contains(&text) || SHORT_VALUED.contains(&text) {
        return Some(Takes::Value);
    }
    let inline = VALUED
        .iter()
        .any(|flag| text.strip_prefix(flag).is_some_and(|v| v.starts_with('=')))
        || SHORT_VALUED
            .iter()
            .any(|flag| text.len() > flag.len() && text.starts_with(flag));
    inline.then_some(Takes::Inline)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> Vec<OsString> {
        text.split(' ').map(OsString::from).collect()
    }

    fn hoisted(text: &str) -> String {
        hoist(line(text))
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn flags_before_the_command_go_after_it() {
        assert_eq!(
            hoisted("composer --address http://h:7070 -o json run list"),
            "composer run list --address http://h:7070 -o json"
        );
        assert_eq!(
            hoisted("composer run --token=abc --namespace shop get r1"),
            "composer run get r1 --token=abc --namespace shop"
        );
        assert_eq!(
            hoisted("composer -ojson server info"),
            "composer server info -ojson"
        );
    }

    #[test]
    fn flags_already_after_the_command_and_everything_after_another_flag_stay() {
        assert_eq!(
            hoisted("composer run list --status RUNNING -o json"),
            "composer run list --status RUNNING -o json"
        );
        assert_eq!(
            hoisted("composer run start wf --input --token"),
            "composer run start wf --input --token",
            "a value that looks like a flag is left alone"
        );
        assert_eq!(hoisted("composer --help"), "composer --help");
    }
}
