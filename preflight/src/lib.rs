//! Machine checks. See ARCHITECTURE.md.
