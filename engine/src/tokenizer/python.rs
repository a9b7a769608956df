//! Values written as Python writes them, for chat templates: transformers
//! renders templates with Python's jinja2, so `{{ x }}` is Python's `str(x)`
//! (`None`, `True`, `['a', 1]`, `1e-05`) and its `tojson` filter is
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)` — no HTML escaping, `", "` and `": "` between items,
//! floats as `repr` writes them. minijinja's own output differs in each of
//! these (`none`, `true`, `["a", 1]`, `"\u003c"` for `<`), and a prompt that
//! differs by one byte is another prompt.

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// How `json.dumps` is asked to write (transformers' `tojson` arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line; otherwise the indent of each level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        Self {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }
}

/// Parameter names of transformers' `tojson`, in positional order.
const TOJSON_PARAMS: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];

impl DumpOptions {
    /// Reads `tojson`'s arguments, positional (in transformers' order) or by name.
    pub fn from_args(args: &[Value], kwargs: &Kwargs) -> Result<Self, Error> {
        if args.len() > TOJSON_PARAMS.len() {
            return Err(invalid("tojson takes at most 4 arguments"));
        }
        let mut given: Vec<(&str, Value)> = TOJSON_PARAMS
            .iter()
            .copied()
            .zip(args.iter().cloned())
            .collect();
        for name in kwargs.args() {
            if !TOJSON_PARAMS.contains(&name) {
                return Err(invalid(format!(
                    "tojson got an unexpected argument `{name}`"
                )));
            }
            if given.iter().any(|(n, _)| *n == name) {
                return Err(invalid(format!("tojson got `{name}` twice")));
            }
            given.push((name, kwargs.get::<Value>(name)?));
        }
        let mut o = DumpOptions::default();
        let mut separators = None;
        for (name, v) in given {
            match name {
                "ensure_ascii" => o.ensure_ascii = v.is_true(),
                "sort_keys" => o.sort_keys = v.is_true(),
                "indent" => o.indent = indent(&v)?,
                _ => separators = (!v.is_none()).then_some(v),
            }
        }
        if o.indent.is_some() {
            // json.dumps: `(',', ': ')` when an indent is given.
            o.item_separator = ",".into();
        }
        if let Some(v) = separators {
            let pair: Vec<Value> = v.try_iter()?.collect();
            match pair.as_slice() {
                [a, b] if a.kind() == ValueKind::String && b.kind() == ValueKind::String => {
                    o.item_separator = a.to_string();
                    o.key_separator = b.to_string();
                }
                _ => return Err(invalid("tojson: `separators` must be two strings")),
            }
        }
        Ok(o)
    }
}

fn indent(v: &Value) -> Result<Option<String>, Error> {
    if v.is_none() || v.is_undefined() {
        return Ok(None);
    }
    if let Some(s) = v.as_str() {
        return Ok(Some(s.to_string()));
    }
    match v.as_i64() {
        // Python: `' ' * n`, empty for n <= 0.
        Some(n) => Ok(Some(
            " ".repeat(usize::try_from(n).unwrap_or(0).min(MAX_INDENT)),
        )),
        None => Err(invalid("tojson: `indent` must be a number or a string")),
    }
}

/// Widest indent written (a template asking for more gets this many).
const MAX_INDENT: usize = 64;

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// transformers' `tojson` filter.
pub fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let opts = DumpOptions::from_args(&args, &kwargs)?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    dump(value, &opts, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// `json.dumps(value)` with the given options.
pub fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    dump(value, opts, 0, &mut out)?;
    Ok(out)
}

fn newline(opts: &DumpOptions, level: usize, out: &mut String) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn dump(value: &Value, opts: &DumpOptions, level: usize, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(value)),
        ValueKind::String => quote_json(value.as_str().unwrap_or_default(), opts.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline(opts, level + 1, out);
                dump(item, opts, level + 1, out)?;
            }
            newline(opts, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline(opts, level + 1, out);
                quote_json(key, opts.ensure_ascii, out);
                out.push_str(&opts.key_separator);
                dump(item, opts, level + 1, out)?;
            }
            newline(opts, level, out);
            out.push('}');
        }
        other => {
            return Err(invalid(format!(
                "tojson: a value of kind {other} is not JSON serializable"
            )));
        }
    }
    Ok(())
}

/// A key as `json.dumps` converts it.
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Number => Ok(number(key)),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::None => Ok("null".into()),
        other => Err(invalid(format!(
            "tojson: keys must be str, int, float, bool or None, not {other}"
        ))),
    }
}

/// An integer as it is, a float as Python's `repr` (and `json.dumps`) writes it.
fn number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(f) if f.is_nan() => "NaN".into(),
        Ok(f) if f.is_infinite() => if f > 0.0 { "Infinity" } else { "-Infinity" }.into(),
        Ok(f) => float_repr(f),
        Err(_) => value.to_string(),
    }
}

/// Python's `repr(float)`: the shortest digits that read back, in fixed
/// notation for exponents -4..=15 and scientific otherwise (`1e-05`, `1e+16`).
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    let body = if (-4..16).contains(&exp) {
        if exp >= 0 {
            let point = exp as usize + 1;
            if digits.len() <= point {
                format!("{digits}{}.0", "0".repeat(point - digits.len()))
            } else {
                format!("{}.{}", &digits[..point], &digits[point..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let rest = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{first}{rest}e{esign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

/// A JSON string literal as `json.dumps` writes it.
fn quote_json(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            // ensure_ascii escapes everything outside ' '..='~'.
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `str(value)`, which `{{ value }}` prints.
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        _ => py_repr(value),
    }
}

/// Python's `repr(value)`, as lists and dicts print their items.
pub fn py_repr(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => match f64::try_from(value.clone()) {
            Ok(f) if !value.is_integer() => float_repr(f),
            _ => value.to_string(),
        },
        ValueKind::String => quote_repr(value.as_str().unwrap_or_default()),
        ValueKind::Seq => match value.try_iter() {
            Ok(items) => format!(
                "[{}]",
                items.map(|v| py_repr(&v)).collect::<Vec<_>>().join(", ")
            ),
            Err(_) => value.to_string(),
        },
        ValueKind::Map => match value.try_iter() {
            Ok(keys) => {
                let entries: Vec<String> = keys
                    .map(|k| {
                        let v = value.get_item(&k).unwrap_or_default();
                        format!("{}: {}", py_repr(&k), py_repr(&v))
                    })
                    .collect();
                format!("{{{}}}", entries.join(", "))
            }
            Err(_) => value.to_string(),
        },
        _ => value.to_string(),
    }
}

/// Python's `repr(str)`: single quotes unless the text holds one and no
/// double quote; backslash, the quote and unprintable characters escaped.
fn quote_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !printable(c) => {
                let n = c as u32;
                if n <= 0xff {
                    out.push_str(&format!("\\x{n:02x}"));
                } else if n <= 0xffff {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `str.isprintable` for the characters templates meet: control
/// characters and every separator but the space are not.
fn printable(c: char) -> bool {
    !(c.is_control()
        || (c.is_whitespace() && c != ' ')
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2060}'..='\u{2064}' | '\u{feff}'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (f, want) in [
            (0.1, "0.1"),
            (1.0, "1.0"),
            (100.0, "100.0"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (-0.0, "-0.0"),
            (-2.5, "-2.5"),
            (0.0, "0.0"),
            (123.456, "123.456"),
        ] {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn repr_quotes_as_python_does() {
        assert_eq!(quote_repr("it's"), "\"it's\"");
        assert_eq!(quote_repr("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(quote_repr("tab\there\u{1}"), "'tab\\there\\x01'");
        assert_eq!(quote_repr("é漢🙂"), "'é漢🙂'");
    }

    #[test]
    fn json_strings_escape_as_json_dumps_does() {
        let mut out = String::new();
        quote_json("é<>&\u{7f}\u{1}🙂", true, &mut out);
        assert_eq!(out, "\"\\u00e9<>&\\u007f\\u0001\\ud83d\\ude42\"");
        out.clear();
        quote_json("é<>&\u{7f}", false, &mut out);
        assert_eq!(out, "\"é<>&\u{7f}\"");
    }
}
