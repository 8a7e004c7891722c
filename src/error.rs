//! The extension's one error type, and the one place an error becomes a PostgreSQL ERROR with its SQLSTATE.
//! Code that can fail returns `Result<_, RagError>`; SQL-callable functions end with `.unwrap_or_raise()`,
//! the worker records `to_string()` as the reason of the document or row it was working on.
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use rag_embed::ProviderError;
use std::fmt;

#[derive(Debug)]
pub enum RagError {
    /// An argument the caller passed is wrong (22023).
    InvalidParameter { message: String, hint: String },
    /// A collection, conversation or other named thing does not exist (42704).
    UndefinedObject { message: String, hint: String },
    /// The thing exists but is not ready for this (55000), e.g. a collection with no vectors yet.
    NotReady { message: String, hint: String },
    /// A provider answered with an error or did not answer; `what` says which call ("embedding", "chat").
    Provider {
        what: &'static str,
        provider: String,
        model: String,
        error: ProviderError,
    },
    /// A provider answered, but not with what was asked for: no vector, a vector of the wrong size (22000).
    ProviderReply { message: String, hint: String },
    /// A provider or local model could not be set up: a missing model directory, a key that cannot be read.
    ProviderSetup { message: String, hint: String },
    /// A query of the extension's own tables failed; `doing` says what for.
    Spi {
        doing: String,
        error: pgrx::spi::Error,
    },
    /// The server lacks a resource for this call: a thread, memory (53200).
    Resources { message: String, hint: String },
    /// A time limit of the extension's own ran out (57014), e.g. rag.expression_timeout.
    Timeout { message: String, hint: String },
    /// The caller may not do this (42501), e.g. act through rag from inside a security-restricted operation.
    InsufficientPrivilege { message: String, hint: String },
    /// A file the call needs is not there (58P01), e.g. a local model's directory.
    MissingFile { message: String, hint: String },
    /// The call writes, and the transaction is read-only (25006).
    ReadOnly { message: String, hint: String },
    /// A transaction that sees one snapshot cannot do this safely given what others committed since (40001):
    /// retried, it does.
    SerializationFailure { message: String, hint: String },
    /// A file could not be turned into text: too large or deep (54000), a format not supported (0A000),
    /// anything else wrong with the file (22023).
    Extraction {
        filename: Option<String>,
        error: rag_extract::ExtractError,
    },
    /// An ERROR raised inside one of the worker's steps, caught and its (sub)transaction rolled back; the
    /// message is PostgreSQL's (with its detail), recorded as the reason of the document or row.
    Aborted(String),
    /// A step gave up waiting for a lock another transaction holds (55P03): done again a little later, not a
    /// failure of the document.
    LockBusy(String),
    /// A step refused what it was given as over one of rag's limits (54000: a watched row's title or markup too
    /// large, markup nested too deep): doing it again gives the same answer until the input changes.
    LimitExceeded(String),
    /// Something the extension's own invariants rule out, e.g. NULL in a NOT NULL column (XX000).
    Internal(String),
}

impl RagError {
    pub fn invalid(message: impl Into<String>, hint: impl Into<String>) -> RagError {
        RagError::InvalidParameter {
            message: message.into(),
            hint: hint.into(),
        }
    }

    pub fn undefined(message: impl Into<String>, hint: impl Into<String>) -> RagError {
        RagError::UndefinedObject {
            message: message.into(),
            hint: hint.into(),
        }
    }

    /// A provider that could not be set up, with no more to say than its message.
    pub fn setup(message: String) -> RagError {
        RagError::ProviderSetup {
            message,
            hint: String::new(),
        }
    }

    /// The SQLSTATE clients see: the mapping of every error the extension raises.
    pub fn sqlstate(&self) -> PgSqlErrorCode {
        match self {
            RagError::InvalidParameter { .. } => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            RagError::UndefinedObject { .. } => PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            RagError::NotReady { .. } => PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            RagError::Provider { error, .. } => match error {
                ProviderError::Transient { .. } => PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
                ProviderError::Permanent { .. } => {
                    PgSqlErrorCode::ERRCODE_EXTERNAL_ROUTINE_EXCEPTION
                }
                ProviderError::InputTooLong { .. } => {
                    PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED
                }
                ProviderError::Interrupted => PgSqlErrorCode::ERRCODE_QUERY_CANCELED,
            },
            RagError::ProviderReply { .. } => PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            RagError::Resources { .. } => PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
            RagError::Timeout { .. } => PgSqlErrorCode::ERRCODE_QUERY_CANCELED,
            RagError::InsufficientPrivilege { .. } => {
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE
            }
            RagError::MissingFile { .. } => PgSqlErrorCode::ERRCODE_UNDEFINED_FILE,
            RagError::ReadOnly { .. } => PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
            RagError::SerializationFailure { .. } => {
                PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE
            }
            RagError::ProviderSetup { .. } => PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
            RagError::Spi { .. } | RagError::Aborted(_) | RagError::Internal(_) => {
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR
            }
            RagError::LockBusy(_) => PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
            RagError::LimitExceeded(_) => PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            RagError::Extraction { error, .. } => match error {
                rag_extract::ExtractError::TooLarge { .. }
                | rag_extract::ExtractError::TooDeep { .. } => {
                    PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED
                }
                rag_extract::ExtractError::UnsupportedFormat { .. } => {
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED
                }
                rag_extract::ExtractError::OutOfResources { .. } => {
                    PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES
                }
                _ => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            },
        }
    }

    pub fn hint(&self) -> String {
        match self {
            RagError::InvalidParameter { hint, .. }
            | RagError::UndefinedObject { hint, .. }
            | RagError::NotReady { hint, .. }
            | RagError::ProviderReply { hint, .. }
            | RagError::Resources { hint, .. }
            | RagError::Timeout { hint, .. }
            | RagError::InsufficientPrivilege { hint, .. }
            | RagError::MissingFile { hint, .. }
            | RagError::ReadOnly { hint, .. }
            | RagError::SerializationFailure { hint, .. }
            | RagError::ProviderSetup { hint, .. } => hint.clone(),
            RagError::Extraction { error, .. } => error.hint().to_string(),
            RagError::Provider { error, .. } => match error {
                ProviderError::Transient { .. } => {
                    "The provider is busy or unreachable; try again, or raise rag.http_timeout."
                }
                ProviderError::Permanent { .. } => {
                    "Check the model name and the provider's credentials; rag_models() lists what the provider serves."
                }
                ProviderError::InputTooLong { .. } => {
                    "Pass a shorter text: a model reads at most its window (rag_known_models() lists window_tokens), and rag_chunk() cuts a text into pieces that fit."
                }
                ProviderError::Interrupted => "",
            }
            .to_string(),
            RagError::Spi { .. }
            | RagError::Aborted(_)
            | RagError::LockBusy(_)
            | RagError::LimitExceeded(_)
            | RagError::Internal(_) => String::new(),
        }
    }

    /// Raises this error as a PostgreSQL ERROR: the SQLSTATE of `sqlstate()`, the message, the hint.
    pub fn raise(self) -> ! {
        raise(self.sqlstate(), self.to_string(), self.hint())
    }
}

impl fmt::Display for RagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RagError::InvalidParameter { message, .. }
            | RagError::UndefinedObject { message, .. }
            | RagError::NotReady { message, .. }
            | RagError::ProviderReply { message, .. }
            | RagError::Resources { message, .. }
            | RagError::Timeout { message, .. }
            | RagError::InsufficientPrivilege { message, .. }
            | RagError::MissingFile { message, .. }
            | RagError::ReadOnly { message, .. }
            | RagError::SerializationFailure { message, .. }
            | RagError::ProviderSetup { message, .. } => f.write_str(message),
            RagError::Extraction {
                filename: Some(name),
                error,
            } => write!(f, "\"{name}\": {error}"),
            RagError::Extraction {
                filename: None,
                error,
            } => write!(f, "{error}"),
            RagError::Provider {
                what,
                provider,
                model,
                error,
            } => write!(
                f,
                "{what} provider \"{provider}\" (model \"{model}\"): {error}"
            ),
            RagError::Spi { doing, error } if doing.is_empty() => write!(f, "{error}"),
            RagError::Spi { doing, error } => write!(f, "{doing}: {error}"),
            RagError::Aborted(message)
            | RagError::LockBusy(message)
            | RagError::LimitExceeded(message)
            | RagError::Internal(message) => f.write_str(message),
        }
    }
}

/// Bare: the caller says what it was doing (`SpiContext::doing`) where the message needs it.
impl From<pgrx::spi::Error> for RagError {
    fn from(error: pgrx::spi::Error) -> RagError {
        RagError::Spi {
            doing: String::new(),
            error,
        }
    }
}

/// Adds what the code was doing to an SPI error, for the message.
pub trait SpiContext<T> {
    fn doing(self, doing: impl FnOnce() -> String) -> Result<T, RagError>;
}

impl<T> SpiContext<T> for Result<T, pgrx::spi::Error> {
    fn doing(self, doing: impl FnOnce() -> String) -> Result<T, RagError> {
        self.map_err(|error| RagError::Spi {
            doing: doing(),
            error,
        })
    }
}

/// Ends a SQL-callable function: the value, or the error raised.
pub trait UnwrapOrRaise<T> {
    fn unwrap_or_raise(self) -> T;
}

impl<T> UnwrapOrRaise<T> for Result<T, RagError> {
    fn unwrap_or_raise(self) -> T {
        self.unwrap_or_else(|error| error.raise())
    }
}

/// An argument a function cannot do without. NULL is the caller's mistake, said with the argument's name
/// (22023), where pgrx would raise its internal "argument 0 must not be null" (XX000) for a non-strict function.
pub fn required<T>(value: Option<T>, argument: &str) -> Result<T, RagError> {
    value.ok_or_else(|| {
        RagError::invalid(
            format!("{argument} must not be NULL"),
            format!("Pass a value for {argument}."),
        )
    })
}

/// A column the schema declares NOT NULL, read through SPI (which types every column as nullable).
pub fn not_null<T>(value: Option<T>, column: &str) -> Result<T, RagError> {
    value.ok_or_else(|| RagError::Internal(format!("{column} is NULL, which its table forbids")))
}

/// Raises an ERROR with a hint; every user-facing failure should tell the user what to do next. The one
/// function that builds an ERROR report, private so that every error goes through `RagError::raise`.
fn raise(code: PgSqlErrorCode, message: impl Into<String>, hint: impl Into<String>) -> ! {
    let hint = hint.into();
    let mut report = ErrorReport::new(code, message.into(), "rag");
    if !hint.is_empty() {
        report = report.set_hint(hint);
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}
