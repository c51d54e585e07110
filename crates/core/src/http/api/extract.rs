//! Extractors whose rejection is an [`Answer`]: a bad query string, path or JSON
//! body is answered as the same JSON 400 (or 413) by every handler.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::http::answer::Answer;

/// A query string, or a 400 naming what is wrong with it.
pub(crate) struct Query<T>(pub T);

/// Path parameters, or a 400 naming what is wrong with them.
pub(crate) struct Path<T>(pub T);

/// A JSON body, or a 400 (413 when over the admin body limit) naming what is wrong with it.
pub(crate) struct Json<T>(pub T);

impl From<QueryRejection> for Answer {
    fn from(rejection: QueryRejection) -> Self {
        Answer::BadRequest(rejection.body_text())
    }
}

impl From<PathRejection> for Answer {
    fn from(rejection: PathRejection) -> Self {
        Answer::BadRequest(rejection.body_text())
    }
}

impl From<JsonRejection> for Answer {
    fn from(rejection: JsonRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Answer::PayloadTooLarge {
                limit: crate::http::ADMIN_MAX_BODY_BYTES,
            }
        } else {
            Answer::BadRequest(rejection.body_text())
        }
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = Answer;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Answer> {
        let axum::extract::Query(value) =
            axum::extract::Query::from_request_parts(parts, state).await?;
        Ok(Self(value))
    }
}

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = Answer;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Answer> {
        let axum::extract::Path(value) =
            axum::extract::Path::from_request_parts(parts, state).await?;
        Ok(Self(value))
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = Answer;

    async fn from_request(request: Request, state: &S) -> Result<Self, Answer> {
        let axum::Json(value) = axum::Json::from_request(request, state).await?;
        Ok(Self(value))
    }
}
