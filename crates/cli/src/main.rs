//! The `abserve` command line: one binary, one subcommand per job.

mod args;
mod cmd_devices;
mod cmd_eval;
mod cmd_experiments;
mod cmd_experiments_create;
mod cmd_generate;
mod cmd_loadtest;
mod cmd_plan;
mod cmd_plan_models;
mod cmd_serve;
mod cmd_worker;
mod plan_table;
mod upstreams;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "abserve",
    version,
    about = "Run many A/B prompt variants on one shared LLM, with memory planned before the first request"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the memory plan for a model (or hypothetical numbers) without loading weights.
    Plan(cmd_plan::PlanArgs),
    /// The devices (CPU, GPUs) this build can run the model on, with their memory.
    Devices(cmd_devices::DevicesArgs),
    /// Run prompts concurrently on one shared model and print each output.
    Generate(cmd_generate::GenerateArgs),
    /// OpenAI-compatible HTTP server over one shared model.
    Serve(cmd_serve::ServeArgs),
    /// Stored experiments and their results.
    Experiments(cmd_experiments::ExperimentsArgs),
    /// Run every variant of an experiment over a dataset, score the answers, compare with control.
    Eval(cmd_eval::EvalArgs),
    /// Answer queued eval jobs (`eval --amqp`) from RabbitMQ on one shared model.
    Worker(cmd_worker::WorkerArgs),
    /// Drive an OpenAI-compatible server with load; --assert-no-oom is the CI check.
    Loadtest(cmd_loadtest::LoadtestArgs),
}

fn main() {
    let cli = Cli::parse();
    let default_level = if matches!(cli.command, Command::Serve(_) | Command::Worker(_)) {
        "info"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ABSERVE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Plan(a) => cmd_plan::run(a),
        Command::Devices(a) => cmd_devices::run(a),
        Command::Generate(a) => cmd_generate::run(a),
        Command::Serve(a) => cmd_serve::run(a),
        Command::Experiments(a) => cmd_experiments::run(a),
        Command::Eval(a) => cmd_eval::run(a),
        Command::Worker(a) => cmd_worker::run(a),
        Command::Loadtest(a) => match cmd_loadtest::run(a) {
            Ok(code) => std::process::exit(code),
            Err(e) => Err(e),
        },
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
