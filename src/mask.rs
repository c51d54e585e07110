//! Masking of configured fields (`mask_fields`) in API and dashboard output.
//! A bare name masks that key at any depth; a dotted path masks one place
//! (arrays on the way apply the rest of the path to every element).

use serde_json::Value;

/// What a masked value is replaced with.
pub const MASK: &str = "***";

/// Masks every configured field in `value`.
pub fn mask(value: &mut Value, fields: &[String]) {
    for field in fields {
        let path: Vec<&str> = field.split('.').collect();
        if path.len() == 1 {
            mask_everywhere(value, field);
        } else {
            mask_path(value, &path);
        }
    }
}

fn mask_everywhere(value: &mut Value, name: &str) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == name {
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
            if let Some(child) = map.get_mut(*first) {
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

    #[test]
    fn bare_names_mask_at_any_depth_and_paths_mask_one_place() {
        let mut body = json!({"email": "a@b", "data": {"email": "c@d", "items": [{"secret": 1}, {"secret": 2}]},
                              "keep": {"secret": 3}});
        mask(&mut body, &["email".into(), "data.items.secret".into()]);
        assert_eq!(
            body,
            json!({"email": "***", "data": {"email": "***", "items": [{"secret": "***"}, {"secret": "***"}]},
                   "keep": {"secret": 3}})
        );
    }
}
