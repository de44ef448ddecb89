//! The JSON API: a request's fields (path, query string or JSON body) become the operation's request message, in the
//! protobuf JSON mapping; the call goes to the same [`CellogService`] gRPC serves, with the request's
//! `Authorization` header as its credential; the answer is the response message as JSON, or an [`ApiError`].

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use cellog_client::limits::MAX_PUBLISH_BATCH;
use cellog_client::token::AUTHORIZATION;
use cellog_proto::v1::{self, cellog_server::Cellog};
use cellog_raft::storage::Storage;
use serde_json::{Map, Value};
use tonic::{Code, Status};

use super::error::ApiError;
use super::forward::Forward;
use super::routes::{self, MAX_BATCH, Matched, PUBLISH_BATCH, Unmatched, Verb};
use super::{Http, openapi};
use crate::metrics::Metered;
use crate::service::CellogService;

/// Answers one request of the JSON API.
pub(crate) async fn serve<S: Storage + Clone>(
    http: &Http<S>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let path = uri.path();
    let verb = match *method {
        Method::GET => Verb::Get,
        Method::POST => Verb::Post,
        Method::PUT => Verb::Put,
        Method::DELETE => Verb::Delete,
        _ => return Err(ApiError::no_route(path)),
    };
    let Matched { route, fields } = routes::find(verb, path).map_err(|unmatched| match unmatched {
        Unmatched::NotFound => ApiError::no_route(path),
        Unmatched::Method(verbs) => {
            let allowed: Vec<&str> = verbs.iter().map(|verb| verb.as_str()).collect();
            ApiError::method_not_allowed(method.as_str(), path, &allowed)
        }
        Unmatched::BadSegment(segment) => {
            ApiError::invalid("BAD_PATH", format!("path segment {segment:?} is not percent-encoded UTF-8"))
        }
    })?;
    let body = body.map_err(ApiError::body)?;
    let input = if route.verb.reads_query() {
        if !body.is_empty() {
            return Err(ApiError::invalid(
                "BAD_BODY",
                format!("{} {} takes its fields from the query string, not a body", route.verb.as_str(), route.path),
            ));
        }
        query_fields(route.rpc, uri.query().unwrap_or(""))?
    } else {
        body_fields(&body)?
    };
    let input = with_path_fields(route.rpc, input, fields)?;
    // The door (`super::door`) checked the credential, took the call's permit and times the call.
    let credential = headers.get(axum::http::header::AUTHORIZATION);
    let answer = call(&http.service, &http.forward, route.rpc, credential, input).await?;
    Ok(axum::Json(answer).into_response())
}

/// A JSON body's fields (an empty body has none).
fn body_fields(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(ApiError::invalid("BAD_JSON", "the request body is JSON but not an object")),
        Err(error) => Err(ApiError::invalid("BAD_JSON", format!("the request body is not JSON: {error}"))),
    }
}

/// A query string's fields, typed as the request message's fields are (a flag is a JSON boolean, the rest strings,
/// which the JSON mapping reads as numbers where a number is due).
fn query_fields(rpc: &str, query: &str) -> Result<Map<String, Value>, ApiError> {
    let mut fields = Map::new();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let value = typed(rpc, &name, value.into_owned())?;
        if fields.insert(name.to_string(), value).is_some() {
            return Err(ApiError::invalid("BAD_QUERY", format!("query field {name:?} is given twice")));
        }
    }
    Ok(fields)
}

fn with_path_fields(
    rpc: &str,
    mut input: Map<String, Value>,
    fields: Vec<(&'static str, String)>,
) -> Result<Value, ApiError> {
    for (name, value) in fields {
        let value = typed(rpc, name, value)?;
        input.insert(name.to_string(), value);
    }
    Ok(Value::Object(input))
}

fn typed(rpc: &str, field: &str, value: String) -> Result<Value, ApiError> {
    if !openapi::is_bool_field(rpc, field) {
        return Ok(Value::String(value));
    }
    match value.as_str() {
        "true" | "" => Ok(Value::Bool(true)),
        "false" => Ok(Value::Bool(false)),
        _ => Err(ApiError::invalid("BAD_QUERY", format!("{field} is true or false, not {value:?}"))),
    }
}

/// `input` as the request message `T`.
fn decode<T: serde::de::DeserializeOwned>(input: Value) -> Result<T, ApiError> {
    serde_json::from_value(input)
        .map_err(|error| ApiError::invalid("BAD_JSON", format!("the request does not fit its message: {error}")))
}

/// `message` as a gRPC request carrying the HTTP request's credential.
pub(crate) fn grpc<T>(credential: Option<&HeaderValue>, message: T) -> Result<tonic::Request<T>, ApiError> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = credential {
        let value = value.to_str().ok().and_then(|value| value.parse().ok()).ok_or_else(|| {
            ApiError::from(cellog_client::status::failed(
                Code::Unauthenticated,
                "UNAUTHENTICATED",
                "the authorization header is not ASCII",
            ))
        })?;
        request.metadata_mut().insert(AUTHORIZATION, value);
    }
    Ok(request)
}

fn encode<T: serde::Serialize>(message: &T) -> Result<Value, ApiError> {
    serde_json::to_value(message)
        .map_err(|error| Status::internal(format!("the answer could not be written as JSON: {error}")).into())
}

/// A copy of `request`'s message, to pass on to the leader if this node is refused.
fn message_of<T: Clone>(request: &tonic::Request<T>) -> T {
    request.get_ref().clone()
}

/// A batch publish's request, `{"messages": [PublishRequest…]}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest {
    messages: Vec<v1::PublishRequest>,
}

macro_rules! operations {
    ($($rpc:literal => $method:ident),* $(,)?) => {
        /// The operations the JSON API calls by name (every unary method of `cellog.v1.Cellog`).
        #[cfg(test)]
        pub(crate) const OPERATIONS: &[&str] = &[$($rpc),*];

        /// Calls operation `rpc` of the service with `input` as its request message.
        /// On a follower, a call it refuses as `NOT_LEADER` is passed on to the leader (see [`Forward`]).
        async fn call<S: Storage + Clone>(
            service: &CellogService<Metered<S>>,
            forward: &Forward,
            rpc: &str,
            credential: Option<&HeaderValue>,
            input: Value,
        ) -> Result<Value, ApiError> {
            match rpc {
                $($rpc => {
                    let request = grpc(credential, decode(input)?)?;
                    let message = message_of(&request);
                    let answer = match Cellog::$method(service, request).await {
                        Ok(answer) => answer.into_inner(),
                        Err(refused) => match Forward::leader_of(&refused).and_then(|leader| forward.client(&leader)) {
                            Some(mut leader) => {
                                let passed = leader.$method(grpc(credential, message)?).await;
                                Forward::answer(refused, passed)?
                            }
                            None => return Err(refused.into()),
                        },
                    };
                    encode(&answer)
                })*
                PUBLISH_BATCH => {
                    let batch: BatchRequest = decode(input)?;
                    if batch.messages.len() > MAX_BATCH {
                        return Err(ApiError::invalid(
                            "TOO_MANY_MESSAGES",
                            format!("a batch carries at most {MAX_BATCH} messages, not {}", batch.messages.len()),
                        ));
                    }
                    let actor = service.callers().actor(&grpc(credential, ())?)?;
                    let mut results = service.publish_all(&actor, batch.messages.clone()).await;
                    // Refused whole as NOT_LEADER (the first was, so all were and none was proposed): passed on.
                    let leader = match results.first().and_then(|first| first.result.as_ref()) {
                        Some(v1::publish_result::Result::Error(error)) => {
                            Forward::leader_of(&cellog_client::status::from_item_error(error.clone()))
                                .and_then(|leader| forward.client(&leader))
                        }
                        _ => None,
                    };
                    if let Some(mut leader) = leader {
                        let refused = cellog_client::status::from_item_error(match &results[0].result {
                            Some(v1::publish_result::Result::Error(error)) => error.clone(),
                            _ => v1::Error::default(),
                        });
                        let requests = batch
                            .messages
                            .chunks(MAX_PUBLISH_BATCH)
                            .map(|messages| v1::PublishBatchRequest { messages: messages.to_vec() })
                            .collect::<Vec<_>>();
                        let passed = leader.publish_batch(grpc(credential, futures::stream::iter(requests))?).await;
                        let mut answers = Forward::answer(refused, passed)?;
                        results.clear();
                        while let Some(answer) = answers.message().await? {
                            results.extend(answer.results);
                        }
                    }
                    Ok(serde_json::json!({ "results": results.iter().map(encode).collect::<Result<Vec<_>, _>>()? }))
                }
                _ => Err(Status::unimplemented(format!("operation {rpc} is not served over HTTP")).into()),
            }
        }
    };
}

operations! {
    "CreateStream" => create_stream,
    "UpdateStream" => update_stream,
    "DeleteStream" => delete_stream,
    "ListStreams" => list_streams,
    "GetStream" => get_stream,
    "Publish" => publish,
    "Read" => read,
    "Recall" => recall,
    "CreateConsumer" => create_consumer,
    "UpdateConsumer" => update_consumer,
    "DeleteConsumer" => delete_consumer,
    "ListConsumers" => list_consumers,
    "GetConsumer" => get_consumer,
    "Fetch" => fetch,
    "Ack" => ack,
    "CommitCursor" => commit_cursor,
    "JoinGroup" => join_group,
    "Heartbeat" => heartbeat,
    "LeaveGroup" => leave_group,
    "ListGroups" => list_groups,
    "GetGroup" => get_group,
    "MemberFetch" => member_fetch,
    "MemberAck" => member_ack,
    "MemberCommit" => member_commit,
    "RegisterPeer" => register_peer,
    "PeerProgress" => peer_progress,
    "UnregisterPeer" => unregister_peer,
    "InitProducer" => init_producer,
    "BeginTransaction" => begin_transaction,
    "PrepareTransaction" => prepare_transaction,
    "CommitTransaction" => commit_transaction,
    "AbortTransaction" => abort_transaction,
    "ClusterStatus" => cluster_status,
    "AddLearner" => add_learner,
    "Promote" => promote,
    "RemoveNode" => remove_node,
    "PutPrincipal" => put_principal,
    "DeletePrincipal" => delete_principal,
    "ListPrincipals" => list_principals,
    "AddToken" => add_token,
    "RevokeToken" => revoke_token,
    "WhoAmI" => who_am_i,
    "RevokeCertificate" => revoke_certificate,
    "ListRevokedCertificates" => list_revoked_certificates,
    "SetQuotas" => set_quotas,
    "GrantMirror" => grant_mirror,
    "ListQuotas" => list_quotas,
    "PutCell" => put_cell,
    "ListCells" => list_cells,
    "PlaceStream" => place_stream,
    "MoveStream" => move_stream,
    "FinishMove" => finish_move,
    "UnplaceStream" => unplace_stream,
    "LocateStream" => locate_stream,
    "FenceStream" => fence_stream,
    "ReceiveStream" => receive_stream,
    "IngestMessages" => ingest_messages,
    "AcceptStream" => accept_stream,
    "GetOwnership" => get_ownership,
    "CreateMirror" => create_mirror,
    "ListMirrors" => list_mirrors,
    "RegisterMirror" => register_mirror,
    "MirrorRead" => mirror_read,
    "MirrorProgress" => mirror_progress,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unary_operation_has_a_route_and_every_route_an_operation() {
        let unary = openapi::unary_methods();
        for rpc in &unary {
            assert!(OPERATIONS.contains(&rpc.as_str()), "{rpc} is not called by the JSON API");
            assert!(routes::ROUTES.iter().any(|route| route.rpc == rpc), "{rpc} has no route");
        }
        for route in routes::ROUTES {
            assert!(
                route.rpc == PUBLISH_BATCH || unary.iter().any(|rpc| rpc == route.rpc),
                "{} {} names {}, not a unary method of cellog.v1.Cellog",
                route.verb.as_str(),
                route.path,
                route.rpc
            );
        }
    }

    #[test]
    fn a_route_s_path_fields_are_fields_of_its_request() {
        for route in routes::ROUTES {
            for field in routes::path_fields(route.path) {
                assert!(openapi::has_field(route.rpc, field), "{}: {field} is not a field of its request", route.path);
            }
        }
    }
}
