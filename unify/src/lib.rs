//! No code: this crate's dependency list turns on, for every workspace
//! member, each feature any member turns on (see `.config/hakari.toml`).
