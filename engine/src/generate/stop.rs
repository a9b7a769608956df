//! Stop strings over streamed text.
//!
//! Text is held back while it could still be the start of a stop string, so
//! the caller never prints part of a stop string that later completes.

/// Scans streamed text for stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopScanner {
    stops: Vec<String>,
    /// Text received but not yet released.
    pending: String,
}

/// What one chunk of text amounts to.
#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// Safe to show; generation goes on.
    Continue(String),
    /// A stop string was found: show this text (what came before it) and stop.
    Stop(String),
}

impl StopScanner {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Scan {
        self.pending.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let before = self.pending[..at].to_string();
            self.pending.clear();
            return Scan::Stop(before);
        }
        let hold = self.held_suffix_len();
        let release = self.pending.len() - hold;
        let out = self.pending[..release].to_string();
        self.pending.drain(..release);
        Scan::Continue(out)
    }

    /// Whatever is still held back, for when generation ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn held_suffix_len(&self) -> usize {
        let p = &self.pending;
        self.stops
            .iter()
            .flat_map(|stop| {
                (1..stop.len().min(p.len() + 1))
                    .filter(move |&n| p.is_char_boundary(p.len() - n) && stop.is_char_boundary(n))
                    .filter(move |&n| p.ends_with(&stop[..n]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_a_possible_prefix_and_stops_on_completion() {
        let mut s = StopScanner::new(vec!["END".into()]);
        assert_eq!(s.push("hello E"), Scan::Continue("hello ".into()));
        assert_eq!(s.push("N"), Scan::Continue(String::new()));
        assert_eq!(s.push("D and more"), Scan::Stop(String::new()));
    }

    #[test]
    fn releases_held_text_when_it_diverges() {
        let mut s = StopScanner::new(vec!["END".into()]);
        assert_eq!(s.push("E"), Scan::Continue(String::new()));
        assert_eq!(s.push("x"), Scan::Continue("Ex".into()));
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn stop_inside_one_chunk_keeps_text_before_it() {
        let mut s = StopScanner::new(vec!["\n\n".into()]);
        assert_eq!(s.push("a\n\nb"), Scan::Stop("a".into()));
    }

    #[test]
    fn multibyte_text_is_split_on_character_boundaries() {
        let mut s = StopScanner::new(vec!["éx".into()]);
        assert_eq!(s.push("café"), Scan::Continue("caf".into()));
        assert_eq!(s.finish(), "é");
    }
}
