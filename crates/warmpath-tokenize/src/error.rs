//! Why loading a tokenizer or tokenizing a request failed.

use std::path::PathBuf;
use thiserror::Error;

/// Why loading a tokenizer or tokenizing a request failed. Load-time variants are
/// configuration errors (retrying does not help until the files are fixed); see
/// [`TokenizeError::is_client_error`] for the per-request ones.
#[derive(Debug, Error)]
pub enum TokenizeError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A configuration file (tokenizer_config.json, chat_template.json) is not
    /// valid JSON or a field has an unexpected shape.
    #[error("{}: {reason}", path.display())]
    BadConfig { path: PathBuf, reason: String },
    #[error("cannot load tokenizer.json: {0}")]
    Load(#[source] tokenizers::Error),
    #[error("chat template does not compile: {0}")]
    TemplateSyntax(#[source] minijinja::Error),
    #[error("the tokenizer has no chat template, so chat requests cannot be tokenized")]
    NoChatTemplate,
    /// Rendering failed: the template raised an exception (e.g. roles must
    /// alternate) or met data it cannot handle. A client error.
    #[error("chat template rendering failed: {0}")]
    Render(#[source] minijinja::Error),
    /// `continue_final_message` was asked for with an unusable last message.
    #[error("continue_final_message: {0}")]
    ContinueFinalMessage(&'static str),
    #[error("tokenization failed: {0}")]
    Encode(#[source] tokenizers::Error),
    /// More tokens than the cap of
    /// [`encode_request_capped`](super::chat::ChatTokenizer::encode_request_capped);
    /// the message is vLLM's.
    #[error("This model's maximum context length is {} tokens. However, your request has {}{seen} input tokens. Please reduce the length of the input messages.", cap + 1, if *complete { "" } else { "at least " })]
    PromptTooLong {
        cap: usize,
        /// Tokens counted when encoding stopped (maybe fewer than the prompt's).
        seen: usize,
        /// Whether `seen` is the whole prompt.
        complete: bool,
    },
}

impl TokenizeError {
    /// The request itself is at fault (answer 400; do not retry the same body).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            TokenizeError::Render(_)
                | TokenizeError::ContinueFinalMessage(_)
                | TokenizeError::PromptTooLong { .. }
        )
    }
}
