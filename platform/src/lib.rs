//! gpum-platform library. See ARCHITECTURE.md.
