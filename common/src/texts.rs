//! The one way a crate of gpum keeps what it prints besides [`crate::Failure`]: a table made
//! with [`texts!`](crate::texts), one row per message, Russian and English side by side.
//!
//! ```
//! gpum_common::texts! {
//!     /// What the example prints.
//!     pub enum Msg {
//!         Hello => ("привет, {name}", "hello, {name}"),
//!     }
//! }
//! use gpum_common::{Lang, texts::fill};
//! assert_eq!(fill(Msg::Hello.text(Lang::En), &[("name", "Ann")]), "hello, Ann");
//! assert_eq!(Msg::ALL, &[Msg::Hello]);
//! ```
//!
//! The macro makes the enum, its [`Msg::text`]-style lookup (a `match` the compiler checks for
//! every row and both languages) and its `ALL`, so a test walks every row without a list typed
//! by hand: [`check`] says whether a row's two texts have the same `{holes}` and whether the
//! English one is free of Russian.

/// Defines a fieldless enum of messages with `ALL` (every variant, in order) and
/// `text(self, lang) -> &'static str`. Rows: `Variant => ("русский", "English"),`.
#[macro_export]
macro_rules! texts {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $var:ident => ($ru:expr, $en:expr $(,)?) ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $name {
            $( $(#[$vmeta])* $var, )*
        }

        impl $name {
            /// Every message, in the table's order.
            pub const ALL: &'static [$name] = &[ $( $name::$var, )* ];

            /// The text in `lang`; `{name}` holes are filled by the caller.
            pub const fn text(self, lang: $crate::Lang) -> &'static str {
                match (self, lang) {
                    $(
                        ($name::$var, $crate::Lang::Ru) => $ru,
                        ($name::$var, $crate::Lang::En) => $en,
                    )*
                }
            }
        }
    };
}

/// The `{name}` holes of a text, sorted (a name twice is listed twice).
pub fn holes(s: &str) -> Vec<&str> {
    let mut v: Vec<&str> = s.split('{').skip(1).filter_map(|p| p.split_once('}')).map(|(h, _)| h).collect();
    v.sort_unstable();
    v
}

/// `template` with each `{name}` replaced by its value, in one pass (a value that holds
/// `{…}` is not filled again). A name the template lacks is a programming error (a debug
/// assertion); a hole without a value stays as it is.
pub fn fill(template: &str, values: &[(&str, &str)]) -> String {
    debug_assert!(
        values.iter().all(|(name, _)| template.contains(&format!("{{{name}}}"))),
        "{template:?} lacks a hole of {values:?}"
    );
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match after.find('}').map(|j| (&after[..j], j)) {
            Some((name, j)) if let Some((_, v)) = values.iter().find(|(n, _)| *n == name) => {
                out.push_str(v);
                rest = &after[j + 1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Whether a row is sound: both texts say something, have the same holes, and the English one
/// holds no Cyrillic. `Err` says what is wrong.
pub fn check(ru: &str, en: &str) -> Result<(), String> {
    if ru.is_empty() || en.is_empty() {
        return Err(format!("an empty text: {ru:?} / {en:?}"));
    }
    if holes(ru) != holes(en) {
        return Err(format!("holes differ: {:?} / {:?}", holes(ru), holes(en)));
    }
    if en.chars().any(|c| ('\u{0400}'..='\u{04FF}').contains(&c)) {
        return Err(format!("Russian in the English text: {en:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Lang;

    crate::texts! {
        enum T {
            A => ("а {x}", "a {x}"),
            B => ("б", "b"),
        }
    }

    #[test]
    fn the_table_has_every_row_in_both_languages() {
        assert_eq!(T::ALL, &[T::A, T::B]);
        assert_eq!(T::A.text(Lang::Ru), "а {x}");
        assert_eq!(T::B.text(Lang::En), "b");
        for t in T::ALL {
            check(t.text(Lang::Ru), t.text(Lang::En)).unwrap();
        }
    }

    #[test]
    fn check_finds_what_is_wrong() {
        assert_eq!(holes("{b} and {a}, {b}"), ["a", "b", "b"]);
        assert!(check("а {x}", "a {y}").is_err());
        assert!(check("а", "а").is_err());
        assert!(check("", "a").is_err());
        assert!(check("а … ‹x›", "a … ‹x›").is_ok());
        assert_eq!(fill("{a}-{b}-{a}", &[("a", "1"), ("b", "2")]), "1-2-1");
        assert_eq!(fill("{a} {b}", &[("a", "{b}"), ("b", "2")]), "{b} 2", "one pass");
        assert_eq!(fill("{ {x}", &[("x", "1")]), "{ 1");
    }
}
