//! The node token, wrapped so that it cannot reach a log by accident.
//!
//! `Debug` and `Display` print a placeholder; the only way to the text is [`Token::expose`],
//! which the HTTP client calls when it sets the `Authorization` header (marked sensitive) and
//! the config writer calls when it writes the 0600 file. Grepping for `expose` finds every use.

use std::fmt;

/// A node token. See the module docs.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// Wraps a token, trimming the whitespace a pasted line carries. `None` when empty or when it
    /// holds characters that cannot be in an HTTP header.
    pub fn new(s: &str) -> Option<Token> {
        let t = s.trim();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        Some(Token(t.to_string()))
    }

    /// The secret itself. Call it only where the token must leave the process.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_printed() {
        let t = Token::new("  abc123secret\n").unwrap();
        assert_eq!(t.expose(), "abc123secret");
        assert!(!format!("{t:?} {t} {:?}", Some(&t)).contains("abc123secret"));
        assert!(Token::new("  \n").is_none());
        assert!(Token::new("a b").is_none());
    }
}
