//! WorkflowService end to end: versions, validation errors with paths.

use std::path::PathBuf;

use composer_proto::v1::{
    GetWorkflowRequest, ListWorkflowVersionsRequest, ListWorkflowsRequest, RegisterWorkflowRequest,
    ValidateWorkflowRequest, workflow_service_client::WorkflowServiceClient,
};
use composer_testkit::ServerProcess;
use tonic_types::StatusExt;

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

const V1: &str = "name: greet\nnodes:\n  - { id: hello, type: TASK, queue: q, task: hello }\n";
const V1_AS_JSON: &str = r#"{"nodes": [{"task": "hello", "queue": "q", "type": "TASK", "id": "hello"}], "name": "greet"}"#;
const V2: &str = "name: greet\ndescription: now louder\nnodes:\n  - { id: hello, type: TASK, queue: q, task: shout }\n";

#[tokio::test]
async fn registering_creates_a_version_only_when_the_content_changes() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut workflows = WorkflowServiceClient::connect(server.url())
        .await
        .expect("connect");
    let register = |source: &str| RegisterWorkflowRequest {
        source: source.to_owned(),
    };

    let first = workflows
        .register_workflow(register(V1))
        .await
        .expect("v1")
        .into_inner();
    assert!(first.created);
    assert_eq!(first.workflow.as_ref().expect("workflow").version, 1);
    let same = workflows
        .register_workflow(register(V1_AS_JSON))
        .await
        .expect("same")
        .into_inner();
    assert!(
        !same.created,
        "the same content as JSON is the same version"
    );
    assert_eq!(same.workflow.expect("workflow").version, 1);
    let second = workflows
        .register_workflow(register(V2))
        .await
        .expect("v2")
        .into_inner();
    assert!(second.created);
    assert_eq!(second.workflow.expect("workflow").version, 2);

    let latest = workflows
        .get_workflow(GetWorkflowRequest {
            name: "greet".to_owned(),
            version: 0,
        })
        .await
        .expect("latest")
        .into_inner()
        .workflow
        .expect("workflow");
    assert_eq!(
        (latest.version, latest.description.as_str()),
        (2, "now louder")
    );
    let old = workflows
        .get_workflow(GetWorkflowRequest {
            name: "greet".to_owned(),
            version: 1,
        })
        .await
        .expect("v1")
        .into_inner()
        .workflow
        .expect("workflow");
    assert_eq!(old.source, V1);
    let missing = workflows
        .get_workflow(GetWorkflowRequest {
            name: "greet".to_owned(),
            version: 9,
        })
        .await
        .expect_err("no v9");
    assert_eq!(missing.code(), tonic::Code::NotFound);

    for name in ["alpha", "beta", "gamma"] {
        let source = V1.replace("greet", name);
        workflows
            .register_workflow(register(&source))
            .await
            .expect("register");
    }
    let mut names = Vec::new();
    let mut token = String::new();
    loop {
        let page = workflows
            .list_workflows(ListWorkflowsRequest {
                page_size: 3,
                page_token: token,
                name_prefix: String::new(),
            })
            .await
            .expect("list")
            .into_inner();
        names.extend(
            page.workflows
                .into_iter()
                .map(|w| (w.name, w.latest_version)),
        );
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let expected: Vec<(String, i32)> = [("alpha", 1), ("beta", 1), ("gamma", 1), ("greet", 2)]
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v))
        .collect();
    assert_eq!(names, expected);
    let versions = workflows
        .list_workflow_versions(ListWorkflowVersionsRequest {
            name: "greet".to_owned(),
            page_size: 0,
            page_token: String::new(),
        })
        .await
        .expect("versions")
        .into_inner();
    let numbers: Vec<i32> = versions.versions.iter().map(|v| v.version).collect();
    assert_eq!(numbers, [2, 1]);
}

#[tokio::test]
async fn a_bad_definition_is_invalid_argument_with_one_violation_per_problem() {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let mut workflows = WorkflowServiceClient::connect(server.url())
        .await
        .expect("connect");
    let broken = "name: broken\nnodes:\n  - { id: a, type: TASK, queue: q, task: t, retry: { max_attempts: 0 } }\n  - { id: b, type: JOIN }\nedges:\n  - { from: a, to: nowhere }\n";
    let status = workflows
        .register_workflow(RegisterWorkflowRequest {
            source: broken.to_owned(),
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let violations = status
        .get_details_bad_request()
        .expect("BadRequest details")
        .field_violations;
    let fields: Vec<&str> = violations.iter().map(|v| v.field.as_str()).collect();
    assert!(
        fields.contains(&"nodes[0].retry.max_attempts"),
        "{fields:?}"
    );
    assert!(fields.contains(&"edges[0].to"), "{fields:?}");
    assert!(
        violations.len() >= 3,
        "every problem at once: {violations:?}"
    );
    let listed = workflows
        .list_workflows(ListWorkflowsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert!(listed.workflows.is_empty(), "nothing stored");

    let validated = workflows
        .validate_workflow(ValidateWorkflowRequest {
            source: broken.to_owned(),
        })
        .await
        .expect("validate answers OK")
        .into_inner();
    assert!(!validated.valid);
    assert_eq!(validated.problems.len(), violations.len());
    let fine = workflows
        .validate_workflow(ValidateWorkflowRequest {
            source: V1.to_owned(),
        })
        .await
        .expect("validate")
        .into_inner();
    assert!(fine.valid && fine.problems.is_empty());

    let empty = workflows
        .register_workflow(RegisterWorkflowRequest {
            source: String::new(),
        })
        .await
        .expect_err("empty");
    assert_eq!(
        empty
            .get_details_bad_request()
            .expect("details")
            .field_violations[0]
            .field,
        "source"
    );
}
