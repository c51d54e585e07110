//! The machinery every top-level section of the configuration shares (docs/configuration.md,
//! top-level keys): the file is flat, but each key belongs to one section's module, which
//! declares it once with [`file_section!`] (its TOML type and its `INHOOK_*` variable) and
//! once with [`section!`] (its validated field, doc comment and whether a reload may change
//! it). The layering (built-in defaults, then the file, then the environment) and the
//! reload check both follow from those two declarations, not from lists kept by hand.

use std::collections::HashMap;

use super::ConfigError;

/// A value an `INHOOK_*` variable may set in place of a key of the file.
pub(super) trait FromEnv: Sized {
    /// The value of variable `var`, set to `raw`; an error names the variable.
    fn from_env(var: &str, raw: &str) -> Result<Self, ConfigError>;
}

impl FromEnv for String {
    fn from_env(_var: &str, raw: &str) -> Result<Self, ConfigError> {
        Ok(raw.to_owned())
    }
}

impl FromEnv for bool {
    /// `true` or `1`; `false`, `0` or empty (docs/configuration.md, environment variables).
    fn from_env(var: &str, raw: &str) -> Result<Self, ConfigError> {
        match raw {
            "true" | "1" => Ok(true),
            "false" | "0" | "" => Ok(false),
            _ => Err(ConfigError(format!("{var}: must be true or false"))),
        }
    }
}

/// The entries of a comma-separated variable, spaces around them trimmed, empty ones dropped.
pub(super) fn comma_list(raw: &str) -> Vec<String> {
    raw.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The environment a section's keys are read from, as the loader holds it.
pub(super) type Env = HashMap<String, String>;

/// Declares the file's keys of one section: a struct of `Option`s (a key left out is
/// `None`), the keys' names, how one key's value is read from the file, and which
/// `INHOOK_*` variable replaces a key (`key: Type = env "INHOOK_…"`).
macro_rules! file_section {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $key:ident : $raw:ty $(= env $var:literal)? ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( pub(super) $key: Option<$raw>, )*
            /// The keys an `INHOOK_*` variable set, with the variable: errors name it.
            from_env: Vec<(&'static str, &'static str)>,
        }

        impl $name {
            /// The section's keys as the file writes them, in declaration order.
            pub(super) const KEYS: &'static [&'static str] = &[$( stringify!($key) ),*];

            /// The keys an `INHOOK_*` variable replaces, with the variable.
            #[cfg(test)]
            pub(super) const VARIABLES: &'static [(&'static str, &'static str)] =
                &[$($( (stringify!($key), $var), )?)*];

            /// Reads the value of `key` from `map` if the key is this section's; answers
            /// whether it was (serde's own errors, with the file's line, pass through).
            pub(super) fn take<'de, A: serde::de::MapAccess<'de>>(
                &mut self,
                key: &str,
                map: &mut A,
            ) -> Result<bool, A::Error> {
                $(
                    if key == stringify!($key) {
                        self.$key = Some(map.next_value()?);
                        return Ok(true);
                    }
                )*
                Ok(false)
            }

            /// Lays the environment over the file: a variable that is set replaces its key.
            #[allow(unused_variables)]
            pub(super) fn apply_env(
                &mut self,
                env: &$crate::config::section::Env,
            ) -> Result<(), $crate::config::ConfigError> {
                $($(
                    if let Some(raw) = env.get($var) {
                        self.$key = Some($crate::config::section::FromEnv::from_env($var, raw)?);
                        self.from_env.push((stringify!($key), $var));
                    }
                )?)*
                Ok(())
            }

            /// What an error about `key` names: the variable that set it, else the key.
            #[allow(dead_code)]
            pub(super) fn origin(&self, key: &'static str) -> &'static str {
                self.from_env
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map_or(key, |(_, var)| var)
            }
        }
    };
}

/// Declares a validated section (or table): its fields with their doc comments, and for
/// each what a reload does when it changed —
/// - `=> restart`: it needs a restart, named by the field;
/// - `=> restart("key")`: the same, named by the key the file writes;
/// - `=> restart(part: "key", …)`: a value read from several keys, each part named by its key;
/// - `=> nested`: the keys the field's own `changed_keys` names;
/// - `=> apart`: not compared here (the reload check compares it on its own, or never).
///
/// From it comes `changed_keys`, the keys a reload names as needing a restart. The derives
/// are the caller's.
macro_rules! section {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                pub $field:ident : $ty:ty => $rule:ident $(($($spec:tt)*))?
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[$field_meta])*
                pub $field: $ty,
            )*
        }

        impl $name {
            /// The keys whose value differs from `other`'s, in declaration order: each
            /// needs a restart.
            pub(super) fn changed_keys(&self, other: &Self) -> Vec<&'static str> {
                #[allow(unused_mut)]
                let mut changed = Vec::new();
                $( section!(@compare self, other, changed, $field, $rule $(($($spec)*))?); )*
                changed
            }
        }
    };
    (@compare $a:expr, $b:expr, $out:ident, $field:ident, restart) => {
        if $a.$field != $b.$field {
            $out.push(stringify!($field));
        }
    };
    (@compare $a:expr, $b:expr, $out:ident, $field:ident, restart($key:literal)) => {
        if $a.$field != $b.$field {
            $out.push($key);
        }
    };
    (@compare $a:expr, $b:expr, $out:ident, $field:ident, restart($($part:ident : $key:literal),* $(,)?)) => {
        $(
            if $a.$field.$part != $b.$field.$part {
                $out.push($key);
            }
        )*
    };
    (@compare $a:expr, $b:expr, $out:ident, $field:ident, nested) => {
        $out.extend($a.$field.changed_keys(&$b.$field));
    };
    (@compare $a:expr, $b:expr, $out:ident, $field:ident, apart) => {};
}

pub(super) use file_section;
pub(super) use section;
