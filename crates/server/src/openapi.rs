//! `GET /openapi.json`: the OpenAPI 3.1 document of every route, generated from the handlers'
//! annotations and the body types of `abserve_protocol` (utoipa). The error answers every route
//! can give (OpenAI's error body) are added to each operation in one place. Experiments and
//! their results are described by the `abserve_ab` types; a statistic that is undefined (no
//! data, a division by zero) is NaN there and `null` in JSON, so those numbers are nullable.

use abserve_protocol::abserve::{
    Deleted, EventsAccepted, Fanout, FanoutResult, Health, Ready, ReadyMemory, ReadyPlan, SseEvent,
};
use abserve_protocol::wire::{
    ChatRequest, Choice, Chunk, ChunkChoice, Common, CompletionRequest, Content, ContentPart,
    Delta, ErrorBody, ErrorObject, Message, Model, ModelList, Prompt, PromptTokensDetails,
    Response, ResponseMessage, Routing, Stop, StreamOptions, Usage,
};
use axum::response::IntoResponse;
use axum::Json;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::{ContentBuilder, Ref, RefOr};
use utoipa::OpenApi;

use crate::experiments::{audit, dashboard, evals, routes as experiments, samples};
use crate::inference::{api, fanout};
use crate::{auth, health};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "abserve",
        description = "OpenAI-compatible API over one shared model, with A/B experiments."
    ),
    paths(
        api::chat,
        api::completions,
        api::models,
        experiments::list,
        experiments::create,
        experiments::get_one,
        experiments::put,
        experiments::delete,
        fanout::fanout,
        experiments::events,
        experiments::results,
        dashboard::engine,
        dashboard::history,
        dashboard::exposures,
        audit::audit_log,
        samples::list,
        samples::export,
        samples::review,
        samples::erase,
        evals::start,
        evals::list,
        evals::one,
        evals::report,
        auth::me,
        health::health,
        health::ready,
        health::metrics,
        openapi_json,
    ),
    components(schemas(
        ChatRequest,
        CompletionRequest,
        Common,
        Message,
        Content,
        ContentPart,
        Stop,
        StreamOptions,
        Prompt,
        Response,
        Choice,
        ResponseMessage,
        Usage,
        PromptTokensDetails,
        Routing,
        Chunk,
        ChunkChoice,
        Delta,
        ErrorBody,
        ErrorObject,
        Model,
        ModelList,
        Ready,
        ReadyMemory,
        ReadyPlan,
        Fanout,
        FanoutResult,
        EventsAccepted,
        Deleted,
        Health,
        SseEvent,
        fanout::FanoutBody,
    ))
)]
struct ApiDoc;

/// The statuses any route may answer with OpenAI's error body, and why.
const ERRORS: [(&str, &str); 10] = [
    ("400", "invalid request (the message and `param` say what)"),
    ("401", "missing or wrong API key"),
    (
        "403",
        "the key's role may not call this route (the message names the role it needs)",
    ),
    ("404", "unknown model, experiment or path"),
    ("405", "method not allowed on this path"),
    ("413", "body larger than --body-limit"),
    (
        "415",
        "a write whose body is not declared as application/json",
    ),
    (
        "429",
        "queue full or queue timeout (Retry-After says when to retry)",
    ),
    (
        "503",
        "shutting down, not ready, engine stopped, or the experiment store cannot be written",
    ),
    ("507", "the experiment store's disk is full"),
];

/// The document, with the common error answers on every operation.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    let error = |why: &str| {
        let content = ContentBuilder::new()
            .schema(Some(RefOr::Ref(Ref::from_schema_name("ErrorBody"))))
            .build();
        RefOr::T(
            ResponseBuilder::new()
                .description(why)
                .content("application/json", content)
                .build(),
        )
    };
    for item in doc.paths.paths.values_mut() {
        for op in [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.delete,
        ]
        .into_iter()
        .flatten()
        {
            for (code, why) in ERRORS {
                op.responses
                    .responses
                    .entry(code.to_string())
                    .or_insert_with(|| error(why));
            }
        }
    }
    doc
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", responses((status = 200, description = "the OpenAPI document", body = Object)))]
pub async fn openapi_json() -> axum::response::Response {
    Json(document()).into_response()
}
