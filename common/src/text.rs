//! Text from elsewhere, made safe to print on a terminal.
//!
//! A node's version, a GPU model, a container name or a server's error reply is written by someone
//! else. Printed raw, an escape sequence in it can clear the operator's screen, move the cursor or
//! forge lines of output (issue 14, item 9). Every human output of the three binaries passes such text
//! through [`escape_controls`] (one line) or [`escape_controls_multiline`] (a block that keeps its
//! line breaks) first.
//!
//! What is escaped: every C0 control (U+0000–U+001F), DEL (U+007F) and every C1 control
//! (U+0080–U+009F), as `\xNN` (`\u{NN}` for C1, since they are not bytes in UTF-8), plus the
//! Unicode characters that reorder or hide text (bidirectional overrides and isolates, U+2028/U+2029
//! line and paragraph separators). A backslash is doubled, so that an escaped form can never be
//! forged by the input itself. Text without any of these is returned borrowed, unchanged.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a terminal raw.
fn needs_escape(c: char) -> bool {
    c.is_control() // C0, DEL and C1
        || matches!(
            c,
            '\\'
            // Line and paragraph separators: some terminals and viewers break lines on them.
            | '\u{2028}' | '\u{2029}'
            // Bidirectional embeddings, overrides and isolates ("Trojan Source").
            | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        )
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

fn escape_with(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    let escape = |c: char| needs_escape(c) && !keep(c);
    let Some(first) = s.find(escape) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 8);
    out.push_str(&s[..first]);
    for c in s[first..].chars() {
        if escape(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s` made safe for one line of terminal output: every control character, line breaks and tabs
/// included, printed escaped (`\x1b`, `\n`, `\u{9b}`), and `\` doubled.
///
/// ```
/// use gpum_common::text::escape_controls;
/// assert_eq!(escape_controls("RTX 4090"), "RTX 4090");
/// assert_eq!(escape_controls("a\x1b[2Jb\nc"), "a\\x1b[2Jb\\nc");
/// ```
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    escape_with(s, |_| false)
}

/// Like [`escape_controls`], but keeps `\n` (and `\t`) as they are: for a block of text that is
/// meant to span lines, such as apt's last lines or a server's error body. `\r` is still escaped,
/// since it lets a line overwrite the one before it.
pub fn escape_controls_multiline(s: &str) -> Cow<'_, str> {
    escape_with(s, |c| c == '\n' || c == '\t')
}

/// A [`std::fmt::Display`] wrapper that prints its text through [`escape_controls`], for use in
/// `format!` without an intermediate `String`: `println!("{}", Escaped(&node.version))`.
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad` keeps width and alignment (`{:<20}`) working on the escaped form.
        f.pad(&escape_controls(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        for s in ["", "NVIDIA GeForce RTX 4090", "0.1.0", "Привет, мир", "GPU-1234-abcd"] {
            assert!(matches!(escape_controls(s), Cow::Borrowed(b) if b == s), "{s:?}");
            assert!(matches!(escape_controls_multiline(s), Cow::Borrowed(b) if b == s));
        }
    }

    #[test]
    fn every_c0_c1_and_del_is_escaped() {
        for cp in (0u32..0x20).chain([0x7f]).chain(0x80..0xa0) {
            let c = char::from_u32(cp).unwrap();
            let input = format!("a{c}b");
            let out = escape_controls(&input);
            assert!(!out.chars().any(|o| o.is_control()), "U+{cp:04X} -> {out:?}");
            assert!(out.starts_with('a') && out.ends_with('b'), "{out:?}");
            assert!(out.len() > input.len(), "U+{cp:04X} not escaped: {out:?}");
        }
    }

    #[test]
    fn known_forms() {
        assert_eq!(escape_controls("\x1b[2J"), "\\x1b[2J");
        assert_eq!(escape_controls("a\nb\r\tc"), "a\\nb\\r\\tc");
        assert_eq!(escape_controls("\0\x7f"), "\\x00\\x7f");
        assert_eq!(escape_controls("x\u{9b}31m"), "x\\u{9b}31m");
        assert_eq!(escape_controls("ab\u{202e}cd"), "ab\\u{202e}cd");
        assert_eq!(escape_controls("line\u{2028}sep"), "line\\u{2028}sep");
    }

    #[test]
    fn a_backslash_cannot_forge_an_escape() {
        // The input spells the escaped form of ESC literally; it must not read like one.
        assert_eq!(escape_controls("\\x1b"), "\\\\x1b");
        assert_ne!(escape_controls("\\x1b"), escape_controls("\x1b"));
    }

    #[test]
    fn multiline_keeps_newlines_and_tabs_but_not_carriage_returns() {
        assert_eq!(
            escape_controls_multiline("E: fail\n\tdetail\rforged\x1b[1A"),
            "E: fail\n\tdetail\\rforged\\x1b[1A"
        );
    }

    #[test]
    fn display_wrapper_escapes_and_pads() {
        assert_eq!(format!("[{:<6}]", Escaped("a\x1bb")), "[a\\x1bb]");
        assert_eq!(format!("[{:<6}]", Escaped("ab")), "[ab    ]");
    }
}
