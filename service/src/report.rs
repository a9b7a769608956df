//! Error text for people: the cause chain joined with ": ", without repeating
//! a cause that an outer error already quotes (library errors often name
//! their source in their own message as well as chaining it).

/// One line describing `error` and its causes.
pub fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("pack.json: {0}")]
    struct Quoting(#[source] std::io::Error);

    #[test]
    fn causes_already_quoted_are_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::new(Quoting(io)).context("cannot verify p");
        assert_eq!(error_text(&e), "cannot verify p: pack.json: no such file");
    }
}
