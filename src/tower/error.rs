//! The middleware's error: refused by admission, or failed inside.

use std::error::Error;
use std::fmt;

use crate::AdmitError;

/// Why a request through [`AdmissionService`](super::AdmissionService)
/// failed.
#[derive(Debug)]
pub enum AdmissionError<E> {
    /// Admission refused the request; the inner service never saw it.
    Rejected(AdmitError),
    /// The inner service failed (it had been admitted).
    Inner(E),
}

impl<E: fmt::Display> fmt::Display for AdmissionError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdmissionError::Rejected(error) => write!(f, "not admitted: {error}"),
            AdmissionError::Inner(error) => write!(f, "{error}"),
        }
    }
}

/// For any displayable inner error, tower's `BoxError` included, so that
/// `AdmissionError<E>` is `Into<BoxError>` and the layer composes with
/// tower's `timeout`, `retry` and the like. The inner error is transparent:
/// its message is this error's, and it is reached by matching on
/// [`Inner`](AdmissionError::Inner) (a `BoxError` does not implement
/// `Error` itself, so it cannot be offered as a `source`).
impl<E: fmt::Debug + fmt::Display> Error for AdmissionError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            AdmissionError::Rejected(error) => Some(error),
            AdmissionError::Inner(_) => None,
        }
    }
}
