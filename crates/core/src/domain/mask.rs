//! Masking of configured fields (`mask_fields`) in everything inhook shows: the
//! read API, the change stream, the dashboard (which only reads the API), and
//! any later view of a payload (e.g. a forwarded payload's preview). Masking is
//! for output only: what is stored and what the workers apply stay whole.
//!
//! A bare name masks that key at any depth; a dotted path masks one place,
//! counted from the payload's root (arrays on the way apply the rest of the path
//! to every element). Key names match case-insensitively (`email` masks `Email`
//! and `EMAIL`).

use serde_json::Value;

/// What a masked value is replaced with.
pub const MASK: &str = "***";

/// Masks every configured field in `value`, a whole payload (an event body, its kept
/// headers, a payload preview).
pub fn mask(value: &mut Value, fields: &[String]) {
    mask_at(value, fields, &[]);
}

/// Masks every configured field in `value`, which sits at `location` inside a payload:
/// a save slot's `progress` is the body's `data`, so `data.email` masks `progress.email`.
/// When `location` itself is masked, the whole value becomes [`MASK`].
pub fn mask_at(value: &mut Value, fields: &[String], location: &[&str]) {
    if masks_whole(fields, location) {
        *value = Value::String(MASK.into());
        return;
    }
    for field in fields {
        let path: Vec<&str> = field.split('.').collect();
        if let [name] = path.as_slice() {
            mask_everywhere(value, name);
        } else if let Some(rest) = strip_location(&path, location) {
            mask_path(value, rest);
        }
    }
}

/// Whether some configured field masks `location` itself (or an ancestor of it), so
/// that [`mask_at`] hides a value there whole.
pub fn masks_whole(fields: &[String], location: &[&str]) -> bool {
    fields.iter().any(|field| {
        let path: Vec<&str> = field.split('.').collect();
        match path.as_slice() {
            [name] => location.iter().any(|step| same_key(step, name)),
            _ => strip_location(&path, location).is_some_and(<[&str]>::is_empty),
        }
    })
}

/// The part of `path` below `location`, if `path` leads through it.
fn strip_location<'p>(path: &'p [&'p str], location: &[&str]) -> Option<&'p [&'p str]> {
    if path.len() < location.len() {
        // A path ending above `location` masks an ancestor, hence all of the value.
        let above = path.iter().zip(location).all(|(a, b)| same_key(a, b));
        return above.then_some(&[]);
    }
    let (head, rest) = path.split_at(location.len());
    head.iter()
        .zip(location)
        .all(|(a, b)| same_key(a, b))
        .then_some(rest)
}

/// Whether a key matches a configured name, ignoring case (Unicode-aware for non-ASCII keys).
fn same_key(key: &str, name: &str) -> bool {
    if key.is_ascii() && name.is_ascii() {
        key.eq_ignore_ascii_case(name)
    } else {
        key.to_lowercase() == name.to_lowercase()
    }
}

fn mask_everywhere(value: &mut Value, name: &str) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if same_key(key, name) {
                    *child = Value::String(MASK.into());
                } else {
                    mask_everywhere(child, name);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| mask_everywhere(v, name)),
        _ => {}
    }
}

fn mask_path(value: &mut Value, path: &[&str]) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(|v| mask_path(v, path)),
        Value::Object(map) => {
            let Some((first, rest)) = path.split_first() else {
                return;
            };
            for (key, child) in map.iter_mut() {
                if !same_key(key, first) {
                    continue;
                }
                if rest.is_empty() {
                    *child = Value::String(MASK.into());
                } else {
                    mask_path(child, rest);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn bare_names_mask_at_any_depth_and_paths_mask_one_place() {
        let mut body = json!({"email": "a@b", "data": {"email": "c@d", "items": [{"secret": 1}, {"secret": 2}]},
                              "keep": {"secret": 3}});
        mask(&mut body, &fields(&["email", "data.items.secret"]));
        assert_eq!(
            body,
            json!({"email": "***", "data": {"email": "***", "items": [{"secret": "***"}, {"secret": "***"}]},
                   "keep": {"secret": 3}})
        );
    }

    #[test]
    fn names_and_paths_match_whatever_the_case() {
        let mut body = json!({"Email": "a", "EMAIL": "b", "eMaIl": {"x": 1},
                              "list": [{"EMail": "c"}, [{"email": "d"}]],
                              "Data": {"Card": {"NUMBER": "4111"}, "number": "kept"},
                              "Émail": "e"});
        mask(&mut body, &fields(&["email", "data.card.number", "émail"]));
        assert_eq!(
            body,
            json!({"Email": "***", "EMAIL": "***", "eMaIl": "***",
                   "list": [{"EMail": "***"}, [{"email": "***"}]],
                   "Data": {"Card": {"NUMBER": "***"}, "number": "kept"},
                   "Émail": "***"})
        );
    }

    #[test]
    fn a_value_inside_a_payload_is_masked_by_paths_from_the_payload_root() {
        let progress = json!({"email": "a", "level": 3, "nested": {"token": "t"}});
        let mut masked = progress.clone();
        mask_at(
            &mut masked,
            &fields(&["DATA.level", "nested.token", "other.level"]),
            &["data"],
        );
        assert_eq!(
            masked,
            json!({"email": "a", "level": "***", "nested": {"token": "t"}})
        );

        for whole in ["data", "Data"] {
            let mut masked = progress.clone();
            mask_at(&mut masked, &fields(&[whole]), &["data"]);
            assert_eq!(masked, json!(MASK), "{whole} masks the value itself");
        }
    }

    #[test]
    fn scalars_and_unmatched_fields_stay() {
        let mut value = json!(["email", 1, null, {"mail": "x"}]);
        let before = value.clone();
        mask(&mut value, &fields(&["email", "a.b"]));
        assert_eq!(value, before);
    }
}
