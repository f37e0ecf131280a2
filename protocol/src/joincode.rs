//! The join-code format.
//!
//! A join code is `GPUM-` followed by 20 Crockford base32 symbols in four groups of five
//! (100 random bits), a hyphen, and one Crockford check symbol (the 100-bit value mod 37):
//!
//! ```text
//! GPUM-7K3QD-M2X9P-4RT8V-H6W1N-Z
//! ```
//!
//! Parsing is forgiving where Crockford is (case, `I`/`L` read as `1`, `O` as `0`, hyphens and
//! spaces anywhere), and strict where it matters: any other symbol, a wrong length or a wrong
//! check symbol is [`JoinCodeError`], so a typo is caught on the machine, before any network
//! call. 100 bits make guessing hopeless; the check symbol catches every single-symbol typo and
//! every adjacent transposition.

use std::fmt;

use rand::RngCore;

const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
/// Crockford's five extra check symbols (values 32..=36).
const CHECK_EXTRA: &[u8; 5] = b"*~$=U";
const PREFIX: &str = "GPUM";
const DATA_LEN: usize = 20;

/// A syntactically valid join code, normalized.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct JoinCode {
    value: u128,
}

/// Why a string is not a join code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinCodeError {
    Prefix,
    Length,
    Symbol,
    Check,
}

impl fmt::Display for JoinCodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JoinCodeError::Prefix => "does not start with GPUM-",
            JoinCodeError::Length => "has the wrong length",
            JoinCodeError::Symbol => "contains a character that cannot be in a join code",
            JoinCodeError::Check => "fails its check character (a typo?)",
        })
    }
}

impl std::error::Error for JoinCodeError {}

fn decode_symbol(c: u8) -> Option<u8> {
    let c = c.to_ascii_uppercase();
    let c = match c {
        b'I' | b'L' => b'1',
        b'O' => b'0',
        c => c,
    };
    ALPHABET.iter().position(|&a| a == c).map(|p| p as u8)
}

fn check_symbol(value: u128) -> u8 {
    let m = (value % 37) as usize;
    if m < 32 { ALPHABET[m] } else { CHECK_EXTRA[m - 32] }
}

impl JoinCode {
    /// A fresh random code (100 bits from the OS RNG).
    pub fn generate() -> Self {
        let mut b = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut b);
        let value = u128::from_le_bytes(b) & ((1u128 << 100) - 1);
        JoinCode { value }
    }

    pub fn parse(s: &str) -> Result<Self, JoinCodeError> {
        let compact: Vec<u8> = s
            .trim()
            .bytes()
            .filter(|c| !matches!(c, b'-' | b' ' | b'\t'))
            .map(|c| c.to_ascii_uppercase())
            .collect();
        if !compact.starts_with(PREFIX.as_bytes()) {
            return Err(JoinCodeError::Prefix);
        }
        let rest = &compact[PREFIX.len()..];
        if rest.len() != DATA_LEN + 1 {
            return Err(JoinCodeError::Length);
        }
        let mut value: u128 = 0;
        for &c in &rest[..DATA_LEN] {
            let v = decode_symbol(c).ok_or(JoinCodeError::Symbol)?;
            value = (value << 5) | v as u128;
        }
        let check = rest[DATA_LEN];
        let check = if CHECK_EXTRA.contains(&check) {
            check
        } else {
            decode_symbol(check).map(|v| ALPHABET[v as usize]).ok_or(JoinCodeError::Symbol)?
        };
        if check != check_symbol(value) {
            return Err(JoinCodeError::Check);
        }
        Ok(JoinCode { value })
    }
}

impl fmt::Display for JoinCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PREFIX)?;
        for i in 0..DATA_LEN {
            if i % 5 == 0 {
                f.write_str("-")?;
            }
            let shift = 5 * (DATA_LEN - 1 - i);
            let v = ((self.value >> shift) & 31) as usize;
            write!(f, "{}", ALPHABET[v] as char)?;
        }
        write!(f, "-{}", check_symbol(self.value) as char)
    }
}

/// Join codes are secrets until used: never print them in `Debug`.
impl fmt::Debug for JoinCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JoinCode(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_forgiving_parse() {
        for _ in 0..200 {
            let c = JoinCode::generate();
            let s = c.to_string();
            assert_eq!(s.len(), 4 + 4 * 6 + 2);
            assert_eq!(JoinCode::parse(&s).unwrap(), c);
            assert_eq!(JoinCode::parse(&s.to_lowercase()).unwrap(), c);
            assert_eq!(JoinCode::parse(&s.replace('-', "")).unwrap(), c);
            assert_eq!(JoinCode::parse(&format!("  {s}\n")).unwrap(), c);
        }
    }

    #[test]
    fn every_single_symbol_typo_is_caught() {
        let c = JoinCode::generate().to_string();
        let b = c.as_bytes();
        for i in 5..b.len() {
            if b[i] == b'-' {
                continue;
            }
            for &sub in ALPHABET {
                if sub == b[i] {
                    continue;
                }
                let mut t = b.to_vec();
                t[i] = sub;
                let t = String::from_utf8(t).unwrap();
                assert!(JoinCode::parse(&t).is_err(), "{t} accepted");
            }
        }
    }

    #[test]
    fn adjacent_transpositions_are_caught() {
        for _ in 0..50 {
            let c: Vec<u8> = JoinCode::generate().to_string().bytes().filter(|&x| x != b'-').collect();
            for i in 4..c.len() - 2 {
                if c[i] == c[i + 1] {
                    continue;
                }
                let mut t = c.clone();
                t.swap(i, i + 1);
                let t = String::from_utf8(t).unwrap();
                assert!(JoinCode::parse(&t).is_err(), "{t} accepted");
            }
        }
    }

    #[test]
    fn malformed() {
        assert_eq!(JoinCode::parse(""), Err(JoinCodeError::Prefix));
        assert_eq!(JoinCode::parse("GPUM-123"), Err(JoinCodeError::Length));
        assert_eq!(JoinCode::parse("GPUM-UUUUU-00000-00000-00000-0"), Err(JoinCodeError::Symbol));
        assert!(!format!("{:?}", JoinCode::generate()).contains("GPUM"));
    }
}
