//! Present so that Cargo reads this crate's build dependencies.
fn main() {}
