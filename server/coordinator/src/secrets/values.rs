//! Secret values at execution time: filled into a node's request where the
//! definition put `${secrets.NAME}`, and taken back out of whatever the
//! node's execution returns before it is stored.

use serde_json::Value as Json;

/// The values of the secrets one execution uses, by name. Dropped with the
/// execution; never serialised.
#[derive(Default, Clone)]
pub struct SecretValues {
    /// Longest value first, so redaction replaces a value containing
    /// another whole.
    values: Vec<(String, String)>,
}

impl std::fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.values.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("SecretValues")
            .field("names", &names)
            .finish()
    }
}

impl SecretValues {
    /// Adds a secret's value.
    pub fn insert(&mut self, name: &str, value: String) {
        let at = self
            .values
            .partition_point(|(_, held)| held.len() >= value.len());
        self.values.insert(at, (name.to_owned(), value));
    }

    /// The values by name, to hand to a code runner.
    pub fn into_map(self) -> std::collections::HashMap<String, String> {
        self.values.into_iter().collect()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with each `${secrets.NAME}` of a held secret replaced by its
    /// value and each escaped `$${secrets.` (data that only looked like a
    /// reference) read back as the literal `${secrets.`.
    pub fn fill_text(&self, text: &str) -> String {
        if !text.contains("${secrets.") {
            return text.to_owned();
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find("${secrets.") {
            let escaped = at > 0 && rest.as_bytes()[at - 1] == b'$';
            if escaped {
                out.push_str(&rest[..at - 1]);
                out.push_str("${secrets.");
                rest = &rest[at + "${secrets.".len()..];
                continue;
            }
            out.push_str(&rest[..at]);
            let after = &rest[at + "${secrets.".len()..];
            let held = after.find('}').and_then(|end| {
                let name = &after[..end];
                self.value_of(name).map(|value| (value, end))
            });
            match held {
                Some((value, end)) => {
                    out.push_str(value);
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str("${secrets.");
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// `value` with every string filled (see [`SecretValues::fill_text`]).
    pub fn fill(&self, value: &Json) -> Json {
        match value {
            Json::String(text) => Json::String(self.fill_text(text)),
            Json::Array(items) => Json::Array(items.iter().map(|v| self.fill(v)).collect()),
            Json::Object(map) => {
                Json::Object(map.iter().map(|(k, v)| (k.clone(), self.fill(v))).collect())
            }
            other => other.clone(),
        }
    }

    /// `text` with every held value replaced by `[secret NAME]`: what an
    /// endpoint echoed back never reaches a run, a log or a trace.
    pub fn redact_text(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (name, value) in &self.values {
            if !value.is_empty() && out.contains(value.as_str()) {
                out = out.replace(value.as_str(), &format!("[secret {name}]"));
            }
        }
        out
    }

    /// `value` with every string (and object key) redacted.
    pub fn redact(&self, value: &Json) -> Json {
        if self.values.is_empty() {
            return value.clone();
        }
        match value {
            Json::String(text) => Json::String(self.redact_text(text)),
            Json::Array(items) => Json::Array(items.iter().map(|v| self.redact(v)).collect()),
            Json::Object(map) => Json::Object(
                map.iter()
                    .map(|(k, v)| (self.redact_text(k), self.redact(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    fn value_of(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The secret names an HTTP task's input declares (its `secrets` list,
/// written by the engine from the definition, never from data).
pub fn declared_names(input: &Json) -> Vec<String> {
    input
        .get("secrets")
        .and_then(Json::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn held() -> SecretValues {
        let mut values = SecretValues::default();
        values.insert("key", "s3cr3t-value".to_owned());
        values.insert("short", "ab".to_owned());
        values
    }

    #[test]
    fn references_are_filled_and_escaped_data_stays_literal() {
        let values = held();
        assert_eq!(
            values.fill_text("Bearer ${secrets.key}"),
            "Bearer s3cr3t-value"
        );
        assert_eq!(
            values.fill_text("a $${secrets.key} b"),
            "a ${secrets.key} b",
            "data that looked like a reference stays text"
        );
        assert_eq!(
            values.fill_text("${secrets.other}"),
            "${secrets.other}",
            "only held secrets are filled"
        );
        assert_eq!(
            values.fill(&json!({"h": ["${secrets.short}${secrets.key}"]})),
            json!({"h": ["abs3cr3t-value"]})
        );
    }

    #[test]
    fn echoed_values_are_redacted_everywhere() {
        let values = held();
        let echoed = json!({
            "body": {"auth": "Bearer s3cr3t-value", "s3cr3t-value": 1},
            "message": "token s3cr3t-value refused"
        });
        let redacted = values.redact(&echoed);
        assert!(!redacted.to_string().contains("s3cr3t-value"), "{redacted}");
        assert_eq!(redacted["body"]["auth"], "Bearer [secret key]");
        assert_eq!(
            values.redact_text("token s3cr3t-value refused"),
            "token [secret key] refused"
        );
        assert!(format!("{values:?}").contains("key"));
        assert!(!format!("{values:?}").contains("s3cr3t"));
    }

    #[test]
    fn a_value_containing_another_is_replaced_whole_whatever_the_order_set() {
        let mut values = SecretValues::default();
        values.insert("inner", "cr3t".to_owned());
        values.insert("outer", "s3cr3t-value".to_owned());
        values.insert("middle", "s3cr3t".to_owned());
        assert_eq!(
            values.redact_text("s3cr3t-value, s3cr3t and cr3t"),
            "[secret outer], [secret middle] and [secret inner]"
        );
    }
}
