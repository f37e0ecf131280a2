//! The dashboard's secrets at the edge: random values for session ids, form keys and links, and
//! their constant-time comparison. Sessions themselves live in the database
//! ([`crate::accounts`]): the browser holds a random 256-bit id in the `__Host-gpum_session`
//! cookie (`Secure`, `HttpOnly`, `SameSite=Strict`, `Path=/`, no `Domain`: only this host can set
//! it, issue 43); the platform keeps only the id's SHA-256, the session's owner, its expiry and
//! its CSRF token.

use rand::RngCore;

/// A fresh 256-bit random value, hex.
pub fn random_hex() -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

/// Equality of two strings without an early exit on the first differing byte.
pub fn ct_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_values_differ_and_equality_is_exact() {
        let (a, b) = (random_hex(), random_hex());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(ct_eq("abc", "abc"));
        assert!(!ct_eq("abc", "abd"));
        assert!(!ct_eq("abc", "ab"));
    }
}
