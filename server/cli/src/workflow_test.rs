//! `composer workflow test FILE --outcomes OUTCOMES.yaml`: runs a workflow
//! in the engine's simulator (scripted task outcomes, a virtual clock, no
//! database) and prints its timeline and result, so workflows can be
//! unit-tested offline. Exits non-zero when the file's `expect` is not met.

use std::path::{Path, PathBuf};

use clap::Args;
use composer_engine::{CompiledWorkflow, Outcomes, ValidationErrors, simulate};

/// Options of `composer workflow test`.
#[derive(Debug, Clone, Args)]
pub struct WorkflowTestArgs {
    /// The workflow definition (YAML or JSON).
    pub file: PathBuf,
    /// The scripted outcomes (YAML): input, task outcomes, events, expect.
    #[arg(long)]
    pub outcomes: PathBuf,
    /// Print only the result, not the timeline.
    #[arg(long)]
    pub quiet: bool,
}

/// Why a workflow test failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowTestError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The definition or outcomes file is invalid.
    #[error("{path} is invalid:\n{problems}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// One problem per line.
        problems: String,
    },
    /// The simulation could not run.
    #[error("simulation failed: {0}")]
    Simulation(String),
    /// The result is not what `expect` says.
    #[error("expectation not met: {0}")]
    Expectation(String),
}

fn read(path: &Path) -> Result<String, WorkflowTestError> {
    std::fs::read_to_string(path).map_err(|source| WorkflowTestError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(path: &Path, errors: ValidationErrors) -> WorkflowTestError {
    WorkflowTestError::Invalid {
        path: path.to_path_buf(),
        problems: errors
            .iter()
            .map(|e| format!("  {}: {}", e.path, e.message))
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// Runs the simulation and prints what happened.
pub fn run(args: &WorkflowTestArgs) -> Result<(), WorkflowTestError> {
    let workflow =
        CompiledWorkflow::from_text(&read(&args.file)?).map_err(|e| invalid(&args.file, e))?;
    let outcomes =
        Outcomes::parse(&read(&args.outcomes)?).map_err(|e| invalid(&args.outcomes, e))?;
    let report =
        simulate(&workflow, &outcomes).map_err(|e| WorkflowTestError::Simulation(e.to_string()))?;
    if !args.quiet {
        print!("{}", report.timeline());
    }
    println!("status: {:?}", report.status);
    println!("priority: {}", report.priority);
    if let Some(key) = &report.concurrency_key {
        println!("concurrency key: {key:?}");
    }
    if let Some(output) = &report.output {
        println!("output: {output}");
    }
    if let Some(error) = &report.error {
        println!("error: {} {}", error.code, error.message);
    }
    if let Some(expect) = &outcomes.expect {
        report
            .check(expect)
            .map_err(WorkflowTestError::Expectation)?;
        println!("expectation met");
    }
    Ok(())
}
