//! Loading what a model folder holds: the one file-reading spot of the crate.

use super::error::TokenizeError;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The special tokens a chat template may refer to (`bos_token`, ...), as strings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub unk: Option<String>,
    pub pad: Option<String>,
}

/// The contents of a tokenizer: tokenizer.json, the chat template and the
/// special tokens from tokenizer_config.json.
#[derive(Clone, Debug)]
pub struct TokenizerFiles {
    pub tokenizer_json: String,
    /// The default chat template, if the model has one.
    pub chat_template: Option<String>,
    /// Special tokens named in tokenizer_config.json.
    pub special_tokens: SpecialTokens,
}

fn read(path: &Path) -> Result<String, TokenizeError> {
    std::fs::read_to_string(path).map_err(|source| TokenizeError::Io {
        path: path.to_owned(),
        source,
    })
}

fn read_optional(path: &Path) -> Result<Option<String>, TokenizeError> {
    path.is_file().then(|| read(path)).transpose()
}

impl TokenizerFiles {
    /// Loads from a folder holding `tokenizer.json`, or that file itself, with
    /// `tokenizer_config.json` (special tokens, `chat_template`) when present;
    /// the template is taken first from `chat_template.jinja`, then
    /// `chat_template.json`, then `tokenizer_config.json`. Start-up only.
    pub fn load(path: &Path) -> Result<Self, TokenizeError> {
        let (dir, tokenizer_path) = if path.is_dir() {
            (path.to_owned(), path.join("tokenizer.json"))
        } else {
            let dir = path.parent().map_or_else(PathBuf::new, Path::to_owned);
            (dir, path.to_owned())
        };
        let tokenizer_json = read(&tokenizer_path)?;
        let config_path = dir.join("tokenizer_config.json");
        let config = read_optional(&config_path)?;
        let mut files = Self::parse(tokenizer_json, config.as_deref(), &config_path)?;
        let ct_json_path = dir.join("chat_template.json");
        if let Some(text) = read_optional(&ct_json_path)? {
            let v = parse_json(&text, &ct_json_path)?;
            if let Some(t) = template_from(v.get("chat_template"), &ct_json_path)? {
                files.chat_template = Some(t);
            }
        }
        if let Some(t) = read_optional(&dir.join("chat_template.jinja"))? {
            files.chat_template = Some(t);
        }
        Ok(files)
    }

    /// Builds from strings: the text of tokenizer.json and, optionally, of
    /// tokenizer_config.json. Reads no file.
    pub fn from_strings(
        tokenizer_json: String,
        tokenizer_config_json: Option<&str>,
    ) -> Result<Self, TokenizeError> {
        Self::parse(tokenizer_json, tokenizer_config_json, Path::new("<memory>"))
    }

    fn parse(
        tokenizer_json: String,
        config: Option<&str>,
        config_path: &Path,
    ) -> Result<Self, TokenizeError> {
        let mut files = TokenizerFiles {
            tokenizer_json,
            chat_template: None,
            special_tokens: SpecialTokens::default(),
        };
        let Some(config) = config else {
            return Ok(files);
        };
        let v = parse_json(config, config_path)?;
        if !v.is_object() {
            return Err(bad(
                config_path,
                "tokenizer_config.json must be a JSON object",
            ));
        }
        files.chat_template = template_from(v.get("chat_template"), config_path)?;
        let tok = |k| special_token(&v, k, config_path);
        files.special_tokens = SpecialTokens {
            bos: tok("bos_token")?,
            eos: tok("eos_token")?,
            unk: tok("unk_token")?,
            pad: tok("pad_token")?,
        };
        Ok(files)
    }
}

fn bad(path: &Path, reason: impl Into<String>) -> TokenizeError {
    TokenizeError::BadConfig {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

fn parse_json(text: &str, path: &Path) -> Result<Value, TokenizeError> {
    serde_json::from_str(text).map_err(|e| bad(path, format!("not valid JSON: {e}")))
}

/// `chat_template`: a string, or a list of `{"name", "template"}` (use `default`).
fn template_from(v: Option<&Value>, path: &Path) -> Result<Option<String>, TokenizeError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            for entry in list {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(Some(t.to_owned())),
                    (Some(_), Some(_)) => {}
                    _ => {
                        return Err(bad(
                            path,
                            "chat_template list entries need string `name` and `template`",
                        ))
                    }
                }
            }
            Err(bad(
                path,
                "chat_template list has no template named `default`",
            ))
        }
        Some(_) => Err(bad(
            path,
            "chat_template must be a string or a list of named templates",
        )),
    }
}

/// The special token at `key`: a string, or an AddedToken object with a string `content`.
fn special_token(config: &Value, key: &str, path: &Path) -> Result<Option<String>, TokenizeError> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(bad(path, format!("{key} object needs a string `content`"))),
        },
        Some(_) => Err(bad(
            path,
            format!("{key} must be a string or an object with `content`"),
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn config_shapes() {
        let cfg = serde_json::json!({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]});
        let f = TokenizerFiles::from_strings("{}".into(), Some(&cfg.to_string())).unwrap();
        assert_eq!(f.chat_template.as_deref(), Some("D"));
        assert_eq!(f.special_tokens.bos.as_deref(), Some("<s>"));
        assert_eq!(f.special_tokens.eos.as_deref(), Some("</s>"));
        assert_eq!(f.special_tokens.unk, None);
        let f = TokenizerFiles::from_strings("{}".into(), None).unwrap();
        assert_eq!(f.chat_template, None);
    }

    #[test]
    fn bad_configs_are_refused() {
        for cfg in [
            "{",
            "[]",
            r#"{"chat_template": 5}"#,
            r#"{"chat_template": [{"name": "x", "template": "T"}]}"#,
            r#"{"chat_template": [{"template": "T"}]}"#,
            r#"{"bos_token": 1}"#,
            r#"{"eos_token": {"lstrip": true}}"#,
        ] {
            let e = TokenizerFiles::from_strings("{}".into(), Some(cfg)).unwrap_err();
            assert!(matches!(e, TokenizeError::BadConfig { .. }), "{cfg}: {e}");
        }
    }

    #[test]
    fn load_reads_a_folder_and_prefers_the_jinja_file() {
        let dir = std::env::temp_dir().join(format!("warmpath-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), "{\"x\":1}").unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"chat_template": "C", "bos_token": "<b>"}"#,
        )
        .unwrap();
        let f = TokenizerFiles::load(&dir).unwrap();
        assert_eq!(f.chat_template.as_deref(), Some("C"));
        assert_eq!(f.tokenizer_json, "{\"x\":1}");
        std::fs::write(dir.join("chat_template.jinja"), "J").unwrap();
        let f = TokenizerFiles::load(&dir.join("tokenizer.json")).unwrap();
        assert_eq!(f.chat_template.as_deref(), Some("J"));
        assert_eq!(f.special_tokens.bos.as_deref(), Some("<b>"));
        let missing = TokenizerFiles::load(&dir.join("nope.json")).unwrap_err();
        assert!(matches!(missing, TokenizeError::Io { .. }), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
