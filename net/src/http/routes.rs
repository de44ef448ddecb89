//! The JSON API's routes, as data: each is an operation of `cellog.v1.Cellog` at a method and path. The router
//! matches requests against this table, and the OpenAPI document is made from it, so a route is written once.
//!
//! A path's `{field}` segments are fields of the operation's request message, by their `.proto` names. A `GET` or
//! `DELETE` takes the message's other fields from the query string; a `POST` or `PUT` from a JSON body (the path wins
//! over the body for the fields it names).

/// An HTTP method the table uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verb {
    Get,
    Post,
    Put,
    Delete,
}

impl Verb {
    /// Its name in the HTTP request line.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Put => "PUT",
            Verb::Delete => "DELETE",
        }
    }

    /// Whether its fields come from the query string rather than a body.
    pub(crate) fn reads_query(self) -> bool {
        matches!(self, Verb::Get | Verb::Delete)
    }
}

/// One route.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Route {
    pub verb: Verb,
    pub path: &'static str,
    /// The operation: a method of `cellog.v1.Cellog`, or [`PUBLISH_BATCH`].
    pub rpc: &'static str,
    /// The section of the OpenAPI document it is listed under.
    pub tag: &'static str,
}

/// The batch publish: `PublishBatch`'s messages in one request, `{"messages": [PublishRequest…]}`, answered in one
/// response, `{"results": [PublishResult…]}`, in order.
pub(crate) const PUBLISH_BATCH: &str = "PublishBatch";

/// The most messages one batch publish carries (a `PublishBatch` call's window).
pub const MAX_BATCH: usize = crate::service::BATCH_WINDOW;

const fn route(verb: Verb, path: &'static str, rpc: &'static str, tag: &'static str) -> Route {
    Route { verb, path, rpc, tag }
}

use Verb::{Delete, Get, Post, Put};

/// Every route of the JSON API.
pub(crate) const ROUTES: &[Route] = &[
    route(Get, "/v1/streams", "ListStreams", "streams"),
    route(Post, "/v1/streams", "CreateStream", "streams"),
    route(Get, "/v1/streams/{name}", "GetStream", "streams"),
    route(Put, "/v1/streams/{name}", "UpdateStream", "streams"),
    route(Delete, "/v1/streams/{name}", "DeleteStream", "streams"),
    route(Post, "/v1/messages", "Publish", "messages"),
    route(Post, "/v1/messages/batch", PUBLISH_BATCH, "messages"),
    route(Get, "/v1/streams/{stream}/partitions/{partition}/messages", "Read", "messages"),
    route(Delete, "/v1/streams/{stream}/partitions/{partition}/messages/{seq}", "Recall", "messages"),
    route(Get, "/v1/streams/{stream}/consumers", "ListConsumers", "consumers"),
    route(Post, "/v1/streams/{stream}/consumers", "CreateConsumer", "consumers"),
    route(Get, "/v1/streams/{stream}/consumers/{name}", "GetConsumer", "consumers"),
    route(Put, "/v1/streams/{stream}/consumers/{name}", "UpdateConsumer", "consumers"),
    route(Delete, "/v1/streams/{stream}/consumers/{name}", "DeleteConsumer", "consumers"),
    route(Post, "/v1/streams/{stream}/consumers/{consumer}/fetch", "Fetch", "consumers"),
    route(Post, "/v1/streams/{stream}/consumers/{consumer}/ack", "Ack", "consumers"),
    route(Post, "/v1/streams/{stream}/consumers/{consumer}/cursor", "CommitCursor", "consumers"),
    route(Get, "/v1/streams/{stream}/groups", "ListGroups", "groups"),
    route(Get, "/v1/streams/{stream}/groups/{group}", "GetGroup", "groups"),
    route(Post, "/v1/streams/{stream}/groups/{group}/join", "JoinGroup", "groups"),
    route(Post, "/v1/streams/{stream}/groups/{group}/heartbeat", "Heartbeat", "groups"),
    route(Post, "/v1/streams/{stream}/groups/{group}/leave", "LeaveGroup", "groups"),
    route(Post, "/v1/streams/{stream}/groups/{group}/fetch", "MemberFetch", "groups"),
    route(Post, "/v1/streams/{stream}/groups/{group}/ack", "MemberAck", "groups"),
    route(Post, "/v1/streams/{stream}/groups/{group}/cursor", "MemberCommit", "groups"),
    route(Post, "/v1/streams/{stream}/peers", "RegisterPeer", "peers"),
    route(Post, "/v1/streams/{stream}/peers/{peer}/progress", "PeerProgress", "peers"),
    route(Delete, "/v1/streams/{stream}/peers/{peer}", "UnregisterPeer", "peers"),
    route(Post, "/v1/producers", "InitProducer", "transactions"),
    route(Post, "/v1/producers/{producer_id}/begin", "BeginTransaction", "transactions"),
    route(Post, "/v1/producers/{producer_id}/prepare", "PrepareTransaction", "transactions"),
    route(Post, "/v1/producers/{producer_id}/commit", "CommitTransaction", "transactions"),
    route(Post, "/v1/producers/{producer_id}/abort", "AbortTransaction", "transactions"),
    route(Get, "/v1/cluster", "ClusterStatus", "cluster"),
    route(Post, "/v1/cluster/learners", "AddLearner", "cluster"),
    route(Post, "/v1/cluster/nodes/{node_id}/promote", "Promote", "cluster"),
    route(Delete, "/v1/cluster/nodes/{node_id}", "RemoveNode", "cluster"),
    route(Get, "/v1/principals", "ListPrincipals", "principals"),
    route(Put, "/v1/principals/{name}", "PutPrincipal", "principals"),
    route(Delete, "/v1/principals/{name}", "DeletePrincipal", "principals"),
    route(Post, "/v1/principals/{principal}/tokens", "AddToken", "principals"),
    route(Post, "/v1/tokens/revoke", "RevokeToken", "principals"),
    route(Get, "/v1/whoami", "WhoAmI", "principals"),
    route(Post, "/v1/certificates/revoke", "RevokeCertificate", "principals"),
    route(Get, "/v1/certificates/revoked", "ListRevokedCertificates", "principals"),
    route(Get, "/v1/quotas", "ListQuotas", "quotas"),
    route(Put, "/v1/quotas", "SetQuotas", "quotas"),
    route(Put, "/v1/principals/{principal}/mirror", "GrantMirror", "principals"),
    route(Get, "/v1/cells", "ListCells", "cells"),
    route(Put, "/v1/cells/{cell}", "PutCell", "cells"),
    route(Get, "/v1/placements/{stream}", "LocateStream", "cells"),
    route(Put, "/v1/placements/{stream}", "PlaceStream", "cells"),
    route(Delete, "/v1/placements/{stream}", "UnplaceStream", "cells"),
    route(Post, "/v1/placements/{stream}/move", "MoveStream", "cells"),
    route(Post, "/v1/placements/{stream}/finish", "FinishMove", "cells"),
    route(Get, "/v1/streams/{stream}/ownership", "GetOwnership", "cells"),
    route(Post, "/v1/streams/{stream}/ownership/receive", "ReceiveStream", "cells"),
    route(Post, "/v1/streams/{stream}/ownership/fence", "FenceStream", "cells"),
    route(Post, "/v1/streams/{stream}/ownership/ingest", "IngestMessages", "cells"),
    route(Post, "/v1/streams/{stream}/ownership/accept", "AcceptStream", "cells"),
    route(Get, "/v1/mirrors", "ListMirrors", "cells"),
    route(Put, "/v1/mirrors/{name}", "CreateMirror", "cells"),
    route(Post, "/v1/streams/{stream}/mirrors/{peer}", "RegisterMirror", "cells"),
    route(Post, "/v1/streams/{stream}/mirrors/{peer}/read", "MirrorRead", "cells"),
    route(Post, "/v1/streams/{stream}/mirrors/{peer}/progress", "MirrorProgress", "cells"),
];

/// What a request's path matched: the route and its path fields, percent-decoded, in the path's order.
pub(crate) struct Matched {
    pub route: &'static Route,
    pub fields: Vec<(&'static str, String)>,
}

/// Why a path matched no route.
pub(crate) enum Unmatched {
    /// No route has this path.
    NotFound,
    /// Routes have this path, under other methods (listed for `Allow`).
    Method(Vec<Verb>),
    /// A path segment is not valid percent-encoded UTF-8.
    BadSegment(String),
}

/// The route of `verb path`.
pub(crate) fn find(verb: Verb, path: &str) -> Result<Matched, Unmatched> {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let mut allowed = Vec::new();
    for route in ROUTES {
        let Some(fields) = fields_of(route.path, &segments)? else { continue };
        if route.verb == verb {
            return Ok(Matched { route, fields });
        }
        allowed.push(route.verb);
    }
    if allowed.is_empty() { Err(Unmatched::NotFound) } else { Err(Unmatched::Method(allowed)) }
}

fn fields_of(template: &'static str, segments: &[&str]) -> Result<Option<Vec<(&'static str, String)>>, Unmatched> {
    let parts: Vec<&'static str> = template.split('/').collect();
    if parts.len() != segments.len() {
        return Ok(None);
    }
    let mut fields = Vec::new();
    for (part, segment) in parts.iter().zip(segments) {
        match part.strip_prefix('{').and_then(|part| part.strip_suffix('}')) {
            Some(field) => {
                if segment.is_empty() {
                    return Ok(None);
                }
                let value = percent_encoding::percent_decode_str(segment)
                    .decode_utf8()
                    .map_err(|_| Unmatched::BadSegment((*segment).to_string()))?;
                fields.push((field, value.into_owned()));
            }
            None if part == segment => {}
            None => return Ok(None),
        }
    }
    Ok(Some(fields))
}

/// The `{field}` names of a path template, in order.
pub(crate) fn path_fields(template: &str) -> impl Iterator<Item = &str> {
    template.split('/').filter_map(|part| part.strip_prefix('{').and_then(|part| part.strip_suffix('}')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_finds_its_route_and_fields() {
        let matched = find(Verb::Post, "/v1/streams/orders/consumers/audit/fetch").ok().expect("a route");
        assert_eq!(matched.route.rpc, "Fetch");
        assert_eq!(matched.fields, vec![("stream", "orders".to_string()), ("consumer", "audit".to_string())]);
        let matched = find(Verb::Get, "/v1/streams/a%2Fb").ok().expect("a route");
        assert_eq!(matched.fields, vec![("name", "a/b".to_string())]);
        assert!(
            matches!(find(Verb::Post, "/v1/streams/orders"), Err(Unmatched::Method(verbs)) if verbs == [Get, Put, Delete])
        );
        assert!(matches!(find(Verb::Get, "/v1/nothing"), Err(Unmatched::NotFound)));
        assert!(matches!(find(Verb::Get, "/v1/streams//consumers"), Err(Unmatched::NotFound)));
        assert!(matches!(find(Verb::Get, "/v1/streams/%FF"), Err(Unmatched::BadSegment(_))));
    }

    #[test]
    fn no_two_routes_share_a_method_and_path_shape() {
        let shape = |route: &Route| {
            let path: Vec<&str> =
                route.path.split('/').map(|part| if part.starts_with('{') { "{}" } else { part }).collect();
            (route.verb, path)
        };
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    shape(a) != shape(b),
                    "{} {} and {} {} overlap",
                    a.verb.as_str(),
                    a.path,
                    b.verb.as_str(),
                    b.path
                );
            }
        }
    }
}
