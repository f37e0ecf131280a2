//! Pinned apt repository keys. See ARCHITECTURE.md.
