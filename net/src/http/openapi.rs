//! The OpenAPI document of the JSON API, made from the route table and the `.proto` descriptors (messages, fields,
//! services and their comments), so nothing about the API is written twice. Schemas follow the protobuf JSON mapping
//! as the API speaks it: the `.proto` field names, 64-bit integers as strings (a number is read too), bytes as
//! base64, enums by name. `docs/openapi.json` in the repository is this document; a test keeps the two equal.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use axum::response::{IntoResponse, Response};
use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorSet};
use serde_json::{Map, Value, json};

use super::routes::{self, PUBLISH_BATCH, ROUTES};

const PACKAGE: &str = "cellog.v1";
const SERVICE: &str = "Cellog";

/// A message of the package, with its comments.
struct MessageDoc {
    descriptor: DescriptorProto,
    comment: String,
    /// Each field's comment, by field name.
    fields: BTreeMap<String, String>,
}

/// A method of the service.
struct MethodDoc {
    name: String,
    input: String,
    output: String,
    streaming: bool,
    comment: String,
}

/// What the descriptors say, by full name without the leading dot (`cellog.v1.StreamInfo`).
struct Descriptors {
    messages: BTreeMap<String, MessageDoc>,
    enums: BTreeMap<String, (Vec<String>, String)>,
    methods: Vec<MethodDoc>,
}

static DESCRIPTORS: LazyLock<Descriptors> = LazyLock::new(|| {
    let set = FileDescriptorSet::decode(cellog_proto::FILE_DESCRIPTOR_SET)
        .expect("the descriptors built with the crate decode");
    let mut descriptors = Descriptors { messages: BTreeMap::new(), enums: BTreeMap::new(), methods: Vec::new() };
    for file in set.file.iter().filter(|file| file.package() == PACKAGE) {
        let comments: BTreeMap<Vec<i32>, String> = file
            .source_code_info
            .iter()
            .flat_map(|info| &info.location)
            .map(|location| {
                let text = [location.leading_comments(), location.trailing_comments()]
                    .iter()
                    .map(|text| text.lines().map(str::trim).collect::<Vec<_>>().join("\n").trim().to_string())
                    .filter(|text| !text.is_empty())
                    .collect::<Vec<_>>()
                    .join("\n");
                (location.path.clone(), text)
            })
            .collect();
        let comment = |path: &[i32]| comments.get(path).cloned().unwrap_or_default();
        for (i, message) in file.message_type.iter().enumerate() {
            add_message(&mut descriptors, PACKAGE, message, vec![4, i as i32], &comment);
        }
        for (i, en) in file.enum_type.iter().enumerate() {
            let values = en.value.iter().map(|value| value.name().to_string()).collect();
            descriptors.enums.insert(format!("{PACKAGE}.{}", en.name()), (values, comment(&[5, i as i32])));
        }
        for (s, service) in file.service.iter().enumerate().filter(|(_, service)| service.name() == SERVICE) {
            for (m, method) in service.method.iter().enumerate() {
                descriptors.methods.push(MethodDoc {
                    name: method.name().to_string(),
                    input: method.input_type().trim_start_matches('.').to_string(),
                    output: method.output_type().trim_start_matches('.').to_string(),
                    streaming: method.client_streaming() || method.server_streaming(),
                    comment: comment(&[6, s as i32, 2, m as i32]),
                });
            }
        }
    }
    descriptors
});

fn add_message(
    descriptors: &mut Descriptors,
    scope: &str,
    message: &DescriptorProto,
    path: Vec<i32>,
    comment: &dyn Fn(&[i32]) -> String,
) {
    let name = format!("{scope}.{}", message.name());
    for (i, nested) in message.nested_type.iter().enumerate() {
        add_message(descriptors, &name, nested, [path.as_slice(), &[3, i as i32]].concat(), comment);
    }
    for (i, en) in message.enum_type.iter().enumerate() {
        let values = en.value.iter().map(|value| value.name().to_string()).collect();
        let at = [path.as_slice(), &[4, i as i32]].concat();
        descriptors.enums.insert(format!("{name}.{}", en.name()), (values, comment(&at)));
    }
    let fields = message
        .field
        .iter()
        .enumerate()
        .map(|(i, field)| (field.name().to_string(), comment(&[path.as_slice(), &[2, i as i32]].concat())))
        .collect();
    descriptors.messages.insert(name, MessageDoc { descriptor: message.clone(), comment: comment(&path), fields });
}

/// The unary methods of `cellog.v1.Cellog`, the operations the JSON API serves.
#[cfg(test)]
pub(crate) fn unary_methods() -> Vec<String> {
    DESCRIPTORS.methods.iter().filter(|method| !method.streaming).map(|method| method.name.clone()).collect()
}

fn request_of(rpc: &str) -> Option<&'static MessageDoc> {
    let method = DESCRIPTORS.methods.iter().find(|method| method.name == rpc)?;
    DESCRIPTORS.messages.get(&method.input)
}

fn field_of(rpc: &str, field: &str) -> Option<&'static FieldDescriptorProto> {
    request_of(rpc)?.descriptor.field.iter().find(|candidate| candidate.name() == field)
}

/// Whether `field` is a field of operation `rpc`'s request.
#[cfg(test)]
pub(crate) fn has_field(rpc: &str, field: &str) -> bool {
    field_of(rpc, field).is_some()
}

/// Whether `field` of operation `rpc`'s request is a flag (a query string gives it as `true` or `false`).
pub(crate) fn is_bool_field(rpc: &str, field: &str) -> bool {
    field_of(rpc, field).is_some_and(|field| field.r#type() == Type::Bool && field.label() != Label::Repeated)
}

/// The name a schema has in the document: the full name without the package (`StreamInfo`, `Outer.Inner`).
fn schema_name(full: &str) -> &str {
    full.strip_prefix(PACKAGE).and_then(|rest| rest.strip_prefix('.')).unwrap_or(full)
}

fn reference(full: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{}", schema_name(full)) })
}

/// The schema of one field's value, in the JSON mapping.
fn field_schema(field: &FieldDescriptorProto) -> Value {
    let type_name = field.type_name().trim_start_matches('.');
    if field.r#type() == Type::Message
        && let Some(entry) = DESCRIPTORS.messages.get(type_name)
        && entry.descriptor.options.as_ref().is_some_and(|options| options.map_entry())
    {
        let value = entry.descriptor.field.iter().find(|field| field.name() == "value");
        return json!({ "type": "object", "additionalProperties": value.map_or(json!({}), value_schema) });
    }
    let schema = value_schema(field);
    if field.label() == Label::Repeated { json!({ "type": "array", "items": schema }) } else { schema }
}

fn value_schema(field: &FieldDescriptorProto) -> Value {
    let type_name = field.type_name().trim_start_matches('.');
    match field.r#type() {
        Type::Double | Type::Float => json!({ "type": "number" }),
        Type::Int32 | Type::Sint32 | Type::Sfixed32 => json!({ "type": "integer", "format": "int32" }),
        Type::Uint32 | Type::Fixed32 => json!({ "type": "integer", "format": "uint32", "minimum": 0 }),
        Type::Int64 | Type::Sint64 | Type::Sfixed64 => {
            json!({ "type": "string", "format": "int64", "description": "a 64-bit integer, as a string (a number is read too)" })
        }
        Type::Uint64 | Type::Fixed64 => {
            json!({ "type": "string", "format": "uint64", "description": "a 64-bit integer, as a string (a number is read too)" })
        }
        Type::Bool => json!({ "type": "boolean" }),
        Type::String => json!({ "type": "string" }),
        Type::Bytes => json!({ "type": "string", "format": "byte", "description": "base64" }),
        Type::Enum | Type::Message | Type::Group => reference(type_name),
    }
}

fn described(mut schema: Value, comment: &str) -> Value {
    if !comment.is_empty()
        && let Value::Object(fields) = &mut schema
    {
        let text = match fields.get("description").and_then(Value::as_str) {
            Some(already) => format!("{comment}\n\n{already}"),
            None => comment.to_string(),
        };
        if fields.contains_key("$ref") {
            // A reference takes no siblings in OpenAPI 3.0 readers: wrap it.
            return json!({ "allOf": [schema], "description": text });
        }
        fields.insert("description".to_string(), text.into());
    }
    schema
}

fn message_schema(doc: &MessageDoc) -> Value {
    let properties: Map<String, Value> = doc
        .descriptor
        .field
        .iter()
        .map(|field| {
            let comment = doc.fields.get(field.name()).map_or("", String::as_str);
            (field.name().to_string(), described(field_schema(field), comment))
        })
        .collect();
    described(json!({ "type": "object", "properties": properties }), &doc.comment)
}

fn parameter(name: &str, location: &str, field: &FieldDescriptorProto, comment: &str) -> Value {
    let mut parameter = json!({ "name": name, "in": location, "schema": field_schema(field) });
    if location == "path" {
        parameter["required"] = true.into();
    }
    if !comment.is_empty() {
        parameter["description"] = comment.into();
    }
    parameter
}

fn error_responses() -> Value {
    json!({
        "default": {
            "description": "an error: the gRPC code's name and the error's detail; the HTTP status follows the code",
            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } }
        }
    })
}

fn operation(route: &routes::Route) -> Value {
    let mut responses = error_responses();
    let (summary, mut parameters, request_body, answer) = if route.rpc == PUBLISH_BATCH {
        let body = json!({
            "type": "object",
            "required": ["messages"],
            "properties": { "messages": { "type": "array", "items": reference("cellog.v1.PublishRequest"),
                "maxItems": routes::MAX_BATCH } }
        });
        let answer = json!({
            "type": "object",
            "properties": { "results": { "type": "array", "items": reference("cellog.v1.PublishResult") } }
        });
        let summary = "Publishes messages in order, pipelined as one PublishBatch call, each answered in place.";
        (summary.to_string(), Vec::new(), Some(body), answer)
    } else {
        let method = DESCRIPTORS.methods.iter().find(|method| method.name == route.rpc && !method.streaming);
        let (comment, input, output) = method
            .map_or(("", "", ""), |method| (method.comment.as_str(), method.input.as_str(), method.output.as_str()));
        let request = DESCRIPTORS.messages.get(input);
        let path_fields: Vec<&str> = routes::path_fields(route.path).collect();
        let mut parameters = Vec::new();
        for name in &path_fields {
            if let Some(doc) = request
                && let Some(field) = doc.descriptor.field.iter().find(|field| field.name() == *name)
            {
                parameters.push(parameter(name, "path", field, doc.fields.get(*name).map_or("", String::as_str)));
            }
        }
        let mut body = None;
        if route.verb.reads_query() {
            for field in request.iter().flat_map(|doc| &doc.descriptor.field) {
                if !path_fields.contains(&field.name()) {
                    let comment = request.and_then(|doc| doc.fields.get(field.name())).map_or("", String::as_str);
                    parameters.push(parameter(field.name(), "query", field, comment));
                }
            }
        } else if !input.is_empty() {
            body = Some(reference(input));
        }
        (comment.to_string(), parameters, body, reference(output))
    };
    responses["200"] = json!({ "description": "the answer", "content": { "application/json": { "schema": answer } } });
    let mut operation = json!({
        "operationId": route.rpc,
        "tags": [route.tag],
        "summary": summary.lines().next().unwrap_or(""),
        "responses": responses,
    });
    if summary.lines().count() > 1 {
        operation["description"] = summary.into();
    }
    if let Some(body) = request_body {
        operation["requestBody"] = json!({ "content": { "application/json": { "schema": body } } });
    }
    if !parameters.is_empty() {
        operation["parameters"] = Value::Array(std::mem::take(&mut parameters));
    }
    operation
}

/// The tail's parameters, shared by its two transports.
fn tail_parameters(resume: Value) -> Value {
    json!([
        { "name": "name", "in": "path", "required": true, "schema": { "type": "string" }, "description": "the stream" },
        { "name": "subject", "in": "query", "schema": { "type": "string" },
          "description": "only messages whose subject this filter matches (wildcards `*` and `>`)" },
        { "name": "from_seq", "in": "query", "schema": { "type": "integer", "minimum": 1 },
          "description": "start at this sequence of every partition (default: now, with the next message)" },
        { "name": "from_time_ms", "in": "query", "schema": { "type": "integer", "minimum": 0 },
          "description": "start at the first message of each partition stored at or after this time (Unix ms)" },
        { "name": "max_behind", "in": "query", "schema": { "type": "integer", "minimum": 1 },
          "description": "the tail is told `lagged` and closed once it is this many messages behind a partition's newest (default 100000)" },
        resume
    ])
}

/// The document.
pub(crate) fn document() -> Value {
    let mut paths = Map::new();
    for route in ROUTES {
        let item = paths.entry(route.path.to_string()).or_insert_with(|| json!({}));
        item[route.verb.as_str().to_ascii_lowercase()] = operation(route);
    }
    let events = "Server-sent events: `message` (data: a Message; id: the position after it, `PARTITION:NEXT_SEQ,…` \
                  for every partition), `lagged` (the tail fell too far behind or its next message was removed \
                  before it was read; the stream ends), `error` (data: an Error; the stream ends); a comment every \
                  15 s keeps proxies from closing it. A tail is read from the node's replica: it writes nothing and \
                  is no consumer.";
    paths.insert(
        "/v1/streams/{name}/tail".to_string(),
        json!({ "get": {
            "operationId": "Tail", "tags": ["messages"],
            "summary": "A live tail of a stream's messages as they are applied, over server-sent events.",
            "description": events,
            "parameters": tail_parameters(json!({ "name": "Last-Event-ID", "in": "header", "schema": { "type": "string" },
                "description": "resume after this event: nothing missed, nothing repeated" })),
            "responses": { "200": { "description": "the events", "content": { "text/event-stream": {} } } }
        }}),
    );
    paths.insert(
        "/v1/streams/{name}/tail/ws".to_string(),
        json!({ "get": {
            "operationId": "TailWebSocket", "tags": ["messages"],
            "summary": "The same tail over WebSocket: each event a text frame {\"id\", \"event\", \"data\"}.",
            "parameters": tail_parameters(json!({ "name": "last_event_id", "in": "query", "schema": { "type": "string" },
                "description": "resume after this event (a browser's WebSocket sets no headers)" })),
            "responses": { "101": { "description": "switching to WebSocket" } }
        }}),
    );
    let mut schemas = Map::new();
    for (name, doc) in &DESCRIPTORS.messages {
        if doc.descriptor.options.as_ref().is_some_and(|options| options.map_entry()) {
            continue;
        }
        schemas.insert(schema_name(name).to_string(), message_schema(doc));
    }
    for (name, (values, comment)) in &DESCRIPTORS.enums {
        schemas.insert(schema_name(name).to_string(), described(json!({ "type": "string", "enum": values }), comment));
    }
    schemas.insert(
        "Error".to_string(),
        json!({
            "type": "object",
            "required": ["error"],
            "properties": { "error": { "allOf": [
                { "$ref": "#/components/schemas/ErrorDetail" },
                { "type": "object", "properties": { "code": { "type": "string",
                    "description": "the gRPC code's name, e.g. NOT_FOUND, UNAVAILABLE" } } }
            ] } }
        }),
    );
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "cellog",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The cellog client API over HTTP: the operations of the gRPC service cellog.v1.Cellog, \
                            their messages in the protobuf JSON mapping. Send `Authorization: Bearer TOKEN`. A node \
                            that does not lead passes the call to the leader; if it cannot reach it, it answers 503 \
                            UNAVAILABLE naming the leader (leader_addr, its gRPC address; header cellog-leader)."
        },
        "security": [{ "bearer": [] }],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } }
        }
    })
}

/// The document as written to `docs/openapi.json`.
pub(crate) fn pretty() -> String {
    let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
    text.push('\n');
    text
}

/// The document, served.
pub(crate) fn served() -> Response {
    static TEXT: LazyLock<String> = LazyLock::new(pretty);
    ([(axum::http::header::CONTENT_TYPE, "application/json")], TEXT.as_str()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::routes::Verb;

    /// `docs/openapi.json` is the document this code makes. After a change to the routes or the `.proto` files,
    /// `CELLOG_UPDATE_OPENAPI=1 cargo test --workspace --lib openapi` writes it again (review the diff).
    #[test]
    fn the_committed_document_is_the_one_served() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
        let made = pretty();
        if std::env::var_os("CELLOG_UPDATE_OPENAPI").is_some() {
            std::fs::write(&path, &made).expect("docs/openapi.json is writable");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == made,
            "docs/openapi.json differs from the document the node serves; run CELLOG_UPDATE_OPENAPI=1 cargo test \
             --workspace --lib openapi and review the diff"
        );
    }

    #[test]
    fn every_route_and_schema_reference_resolves() {
        let document = document();
        let schemas = document["components"]["schemas"].as_object().expect("schemas");
        let text = document.to_string();
        for reference in text.split("\"#/components/schemas/").skip(1) {
            let name = reference.split('"').next().unwrap_or("");
            assert!(schemas.contains_key(name), "a reference to {name} has no schema");
        }
        assert!(matches!(ROUTES.first().map(|route| route.verb), Some(Verb::Get)));
        assert_eq!(
            document["paths"]["/v1/streams/{stream}/partitions/{partition}/messages"]["get"]["parameters"]
                .as_array()
                .map(Vec::len),
            Some(5),
            "Read: stream and partition in the path, from_seq, max and local in the query"
        );
    }
}
