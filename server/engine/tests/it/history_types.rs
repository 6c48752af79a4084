//! The history event types are one list: the engine's enum, the API's
//! comment and the documentation name the same types, in the same order.

use composer_engine::history::HistoryEventType;

fn repo_file(path: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
    std::fs::read_to_string(format!("{root}{path}")).expect(path)
}

fn names() -> Vec<&'static str> {
    HistoryEventType::ALL.iter().map(|t| t.as_str()).collect()
}

#[test]
fn the_documentation_lists_every_type_with_its_meaning() {
    let doc = repo_file("docs/history.md");
    let rows: Vec<(String, String)> = doc
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once("` | "))
        .map(|(name, meaning)| (name.to_owned(), meaning.trim_end_matches(" |").to_owned()))
        .collect();
    let expected: Vec<(String, String)> = HistoryEventType::ALL
        .iter()
        .map(|t| (t.as_str().to_owned(), t.meaning().to_owned()))
        .collect();
    assert_eq!(rows, expected);
}

#[test]
fn the_api_comment_lists_every_type() {
    let proto = repo_file("api/composer/v1/common.proto");
    let start = proto
        .find("// What happened, one of")
        .expect("the event_type comment");
    let end = proto[start..].find("string event_type").expect("the field") + start;
    let listed: Vec<&str> = proto[start..end]
        .lines()
        .skip(1)
        .flat_map(|line| line.trim_start_matches([' ', '/']).split(','))
        .map(|name| name.trim().trim_end_matches('.'))
        .filter(|name| !name.is_empty())
        .collect();
    assert_eq!(listed, names());
}

#[test]
fn names_are_unique_and_snake_case() {
    let mut seen = std::collections::HashSet::new();
    for name in names() {
        assert!(seen.insert(name), "{name} twice");
        assert!(
            name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{name}"
        );
    }
}
