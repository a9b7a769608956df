//! A small blocking client of the service's HTTP API, for the CLI.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::http::token_path;

/// Port the service listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 7433;
/// File in the data dir where a running service writes its URL.
pub const ENDPOINT_FILE: &str = "endpoint";
/// How long a request may take before the client gives up.
const TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot read the service token at {path} ({source}); has `longhaul serve` run with this data dir?"
    )]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the service at {url}: {reason}; is `longhaul serve` running?")]
    Unreachable { url: String, reason: String },
    #[error("{message} (HTTP {status})")]
    Api { status: u16, message: String },
    #[error("unexpected answer from the service: {0}")]
    Protocol(String),
}

pub struct Client {
    base: String,
    token: String,
    agent: ureq::Agent,
}

/// The service's data dir: `$XDG_DATA_HOME/longhaul`, else
/// `~/.local/share/longhaul` (macOS: `~/Library/Application Support/Longhaul`).
/// The caller reads the two variables, so this library reads no environment.
pub fn default_data_dir(
    xdg_data_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> PathBuf {
    if let Some(x) = xdg_data_home.filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("longhaul");
    }
    let home = home.map_or_else(|| PathBuf::from("."), PathBuf::from);
    crate::platform::data_dir_in_home(&home)
}

/// The service URL: given, else the one a running service wrote, else the default port.
pub fn service_url(data_dir: &Path, given: Option<&str>) -> String {
    if let Some(u) = given {
        return u.trim_end_matches('/').to_string();
    }
    std::fs::read_to_string(data_dir.join(ENDPOINT_FILE))
        .ok()
        .map(|s| s.trim().trim_end_matches('/').to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("http://127.0.0.1:{DEFAULT_PORT}"))
}

/// `text` made safe as one URL path segment.
pub fn path_segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl Client {
    /// A client for the service using `data_dir`'s token.
    pub fn new(data_dir: &Path, url: Option<&str>) -> Result<Self, ClientError> {
        let path = token_path(data_dir);
        let token = std::fs::read_to_string(&path)
            .map_err(|source| ClientError::Token {
                path: path.clone(),
                source,
            })?
            .trim()
            .to_string();
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Self {
            base: service_url(data_dir, url),
            token,
            agent,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    fn unreachable(&self, e: ureq::Error) -> ClientError {
        ClientError::Unreachable {
            url: self.base.clone(),
            reason: e.to_string(),
        }
    }

    /// The body of a successful response, or the API's error message.
    fn body_text(
        &self,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<String, ClientError> {
        let mut response = response.map_err(|e| self.unreachable(e))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if status >= 400 {
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or(text);
            return Err(ClientError::Api { status, message });
        }
        Ok(text)
    }

    fn finish<T: DeserializeOwned>(
        &self,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<T, ClientError> {
        let text = self.body_text(response)?;
        let text = if text.is_empty() { "null".into() } else { text };
        serde_json::from_str(&text).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let r = self
            .agent
            .get(format!("{}{path}", self.base))
            .header("Authorization", &format!("Bearer {}", self.token))
            .call();
        self.finish(r)
    }

    /// A response body as text (exports).
    pub fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let r = self
            .agent
            .get(format!("{}{path}", self.base))
            .header("Authorization", &format!("Bearer {}", self.token))
            .call();
        self.body_text(r)
    }

    pub fn post<T: DeserializeOwned>(&self, path: &str, body: &Value) -> Result<T, ClientError> {
        let r = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Authorization", &format!("Bearer {}", self.token))
            .send_json(body);
        self.finish(r)
    }

    pub fn put<T: DeserializeOwned>(&self, path: &str, body: &Value) -> Result<T, ClientError> {
        let r = self
            .agent
            .put(format!("{}{path}", self.base))
            .header("Authorization", &format!("Bearer {}", self.token))
            .send_json(body);
        self.finish(r)
    }

    pub fn delete(&self, path: &str) -> Result<(), ClientError> {
        let r = self
            .agent
            .delete(format!("{}{path}", self.base))
            .header("Authorization", &format!("Bearer {}", self.token))
            .call();
        self.finish::<Value>(r).map(|_| ())
    }

    /// Follows the event stream, calling `on_event(name, data)` until it returns false.
    pub fn events(
        &self,
        mut on_event: impl FnMut(&str, &Value) -> bool,
    ) -> Result<(), ClientError> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let response = agent
            .get(format!("{}/api/events", self.base))
            .header("Authorization", &format!("Bearer {}", self.token))
            .header("Accept", "text/event-stream")
            .call()
            .map_err(|e| self.unreachable(e))?;
        if response.status().as_u16() >= 400 {
            return Err(ClientError::Api {
                status: response.status().as_u16(),
                message: "the event stream was refused".into(),
            });
        }
        let reader = std::io::BufReader::new(response.into_body().into_reader());
        let mut name = String::new();
        for line in reader.lines() {
            let line = line.map_err(|e| ClientError::Protocol(e.to_string()))?;
            if let Some(n) = line.strip_prefix("event:") {
                name = n.trim().to_string();
            } else if let Some(d) = line.strip_prefix("data:") {
                let data: Value = serde_json::from_str(d.trim()).unwrap_or(Value::Null);
                if !on_event(&name, &data) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_become_safe_path_segments() {
        assert_eq!(super::path_segment("big model/v2"), "big%20model%2Fv2");
        assert_eq!(super::path_segment("kimi-k2.5_q8"), "kimi-k2.5_q8");
    }
}
