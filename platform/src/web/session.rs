//! Dashboard sessions, in memory: a random 256-bit id goes to the browser in an `HttpOnly`,
//! `SameSite=Strict` cookie (and `Secure` when the public URL is https); the server keeps only
//! the id's SHA-256, the session's expiry and its CSRF token. A restart of the platform signs
//! everyone out, which costs an owner one paste of the admin token.
//!
//! Bounded: at most [`MAX_SESSIONS`] live at once (expired ones are dropped first, then the
//! oldest), so signing in again and again cannot grow the map.

use std::collections::HashMap;
use std::sync::Mutex;

use rand::RngCore;
use sha2::{Digest, Sha256};

/// How long a session lasts from sign-in, in seconds.
pub const SESSION_TTL_SECS: u64 = 12 * 3600;
/// Sessions kept at once.
pub const MAX_SESSIONS: usize = 256;

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

#[derive(Debug, Clone)]
pub struct Session {
    pub csrf: String,
    created: u64,
    expires: u64,
}

#[derive(Default)]
pub struct Sessions {
    by_hash: Mutex<HashMap<[u8; 32], Session>>,
}

fn key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    /// Starts a session at `now`; returns the id for the cookie (never stored).
    pub fn create(&self, now: u64) -> String {
        let id = random_hex();
        let mut map = self.by_hash.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| s.expires > now);
        while map.len() >= MAX_SESSIONS {
            let Some(oldest) = map.iter().min_by_key(|(_, s)| s.created).map(|(k, _)| *k) else { break };
            map.remove(&oldest);
        }
        map.insert(key(&id), Session { csrf: random_hex(), created: now, expires: now + SESSION_TTL_SECS });
        id
    }

    /// The live session for a cookie's id.
    pub fn get(&self, id: &str, now: u64) -> Option<Session> {
        let mut map = self.by_hash.lock().unwrap_or_else(|e| e.into_inner());
        let k = key(id);
        match map.get(&k) {
            Some(s) if s.expires > now => Some(s.clone()),
            Some(_) => {
                map.remove(&k);
                None
            }
            None => None,
        }
    }

    /// Ends a session (sign-out).
    pub fn remove(&self, id: &str) {
        self.by_hash.lock().unwrap_or_else(|e| e.into_inner()).remove(&key(id));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_hash.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_end_and_stay_bounded() {
        let s = Sessions::default();
        let id = s.create(100);
        assert_eq!(id.len(), 64);
        let sess = s.get(&id, 101).expect("live");
        assert_eq!(sess.csrf.len(), 64);
        assert!(s.get("not-a-session", 101).is_none());
        assert!(s.get(&id, 100 + SESSION_TTL_SECS).is_none(), "expired");
        assert!(s.is_empty(), "an expired session is dropped when seen");
        let id = s.create(200);
        s.remove(&id);
        assert!(s.get(&id, 201).is_none(), "signed out");
        for i in 0..MAX_SESSIONS + 10 {
            s.create(300 + i as u64);
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        // Only hashes are kept: no key equals an id handed out.
        let id = s.create(1000);
        let map = s.by_hash.lock().unwrap();
        assert!(map.keys().all(|k| hex::encode(k) != id));
    }

    #[test]
    fn constant_time_equality() {
        assert!(ct_eq("abc", "abc"));
        assert!(!ct_eq("abc", "abd"));
        assert!(!ct_eq("abc", "ab"));
    }
}
