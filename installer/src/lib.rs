//! gpum-install library. See ARCHITECTURE.md.
