//! OpenAI's wire format as abserve speaks it: [`request`] bodies the server reads and the
//! clients write, [`response`] bodies and stream chunks the server writes and the clients read.

mod request;
mod response;

pub use request::{
    ChatRequest, Common, CompletionRequest, Content, ContentPart, Message, Prompt, Stop,
    StreamOptions,
};
pub use response::{
    ChatLogprobs, Choice, Chunk, ChunkChoice, Delta, ErrorBody, ErrorObject, Logprobs, Model,
    ModelList, PromptTokensDetails, Response, ResponseMessage, Routing, TextLogprobs, TokenLogprob,
    TopLogprob, Usage,
};
