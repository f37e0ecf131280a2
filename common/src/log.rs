//! The log lines of the agent and the platform (feature `log`): every field's value escaped,
//! and colour only where a person reads a terminal.
//!
//! Log fields carry text someone else wrote: a node id, a probe image, an engine's error, an
//! e-mail typed into the sign-in form. Printed raw, a newline in one starts a forged log line
//! and an escape sequence clears an operator's terminal or retitles it when `journalctl` shows
//! it (issue 29, item 7; issue 43, item 10). [`EscapedFields`] escapes every value (the message
//! included) where every field of every line is formatted, whether a field is written with `%`
//! (Display) or `?` (Debug), so no call site can forget it.

use std::fmt::Write as _;

/// The log lines' fields, laid out as tracing-subscriber's default (`message` first, then
/// `name=value` separated by spaces, the `log.` metadata of `log` records left out), with each
/// value passed through [`escape_controls`](crate::text::escape_controls).
pub struct EscapedFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for EscapedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut v = FieldVisitor { writer, first: true, result: Ok(()) };
        fields.record(&mut v);
        v.result
    }
}

struct FieldVisitor<'w> {
    writer: tracing_subscriber::fmt::format::Writer<'w>,
    first: bool,
    result: std::fmt::Result,
}

impl tracing::field::Visit for FieldVisitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        let sep = if std::mem::take(&mut self.first) { "" } else { " " };
        self.result = match name {
            "message" => write!(self.writer, "{sep}"),
            name => write!(self.writer, "{sep}{name}="),
        }
        .and_then(|()| write!(EscapingWriter(&mut self.writer), "{value:?}"));
    }
}

/// Writes through to `W` with control characters escaped, chunk by chunk (escaping is per
/// character, so where the chunks split does not matter); plain text passes as it is.
struct EscapingWriter<'a, W>(&'a mut W);

impl<W: std::fmt::Write> std::fmt::Write for EscapingWriter<'_, W> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.write_str(&crate::text::escape_controls(s))
    }
}

/// Whether log lines are coloured: only when they go to a terminal, and never when `NO_COLOR`
/// (`no_color`, the variable's value) is set to anything but empty. A log file or the journal
/// gets no escape sequence.
pub fn colour(to_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    to_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A newline, a carriage return or an escape sequence in any field, the message included,
    /// stays inside its one line.
    #[test]
    fn every_field_of_a_line_is_escaped() {
        let buf = Buf::default();
        let b = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || b.clone())
            .with_ansi(false)
            .fmt_fields(EscapedFields)
            .finish();
        tracing::subscriber::with_default(sub, || {
            let email = "a@b.c\nINFO forged line";
            tracing::warn!(email = %email, other = ?"x\r\x1b[2Jy", "sign-in failed: {}", "m\u{202e}sg\n");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(out.lines().count(), 1, "{out:?}");
        assert!(!out.contains('\x1b') && !out.contains('\r') && !out.contains('\u{202e}'), "{out:?}");
        // Display (`%`) escaped here; Debug (`?`) is Debug's escaping, its backslashes doubled.
        assert!(
            out.contains(
                r#"sign-in failed: m\u{202e}sg\n email=a@b.c\nINFO forged line other="x\\r\\u{1b}[2Jy""#
            ),
            "{out:?}"
        );
    }

    #[test]
    fn colour_only_on_a_terminal_and_never_with_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
        assert!(!colour(false, Some(OsStr::new(""))));
    }
}
