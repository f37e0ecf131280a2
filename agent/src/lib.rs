//! gpum-agent library. See ARCHITECTURE.md.
