//! ListRuns' version and search filters and CountRuns, end to end: the
//! real binary on real Postgres. CountRuns must agree with a ListRuns walk
//! over the same filters, and both refuse the same bad filters.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use composer_proto::v1::{
    CancelRunRequest, CountRunsRequest, ListRunsRequest, Run, RunStatus, StartRunRequest,
};
use composer_testkit::{ServerProcess, client::TestClient};
use serde_json::json;

use crate::common::violated_field;

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

const IDLE_V1: &str = "name: idle\nnodes:\n  - { id: wait, type: WAIT_FOR_EVENT, event: never }\n";
const IDLE_V2: &str = "name: idle\nnodes:\n  - { id: wait2, type: WAIT_FOR_EVENT, event: never }\n";
const QUICK: &str = "name: quick\nnodes:\n  - { id: nap, type: WAIT, duration: 1ms }\n";

async fn server_and_client() -> (ServerProcess, TestClient) {
    let server = ServerProcess::start(&composer_binary(), &[]).await;
    let client = TestClient::connect(&server.url()).await;
    (server, client)
}

async fn start(client: &mut TestClient, workflow: &str, version: i32, key: &str) -> String {
    client
        .runs
        .start_run(StartRunRequest {
            workflow_name: workflow.to_owned(),
            version,
            idempotency_key: key.to_owned(),
            ..Default::default()
        })
        .await
        .expect("start")
        .into_inner()
        .run
        .expect("run")
        .run_id
}

/// Every run ListRuns returns for `request`, walking every page.
async fn walk(client: &mut TestClient, mut request: ListRunsRequest) -> Vec<Run> {
    request.page_size = 2;
    let mut runs = Vec::new();
    loop {
        let page = client
            .runs
            .list_runs(request.clone())
            .await
            .expect("list")
            .into_inner();
        runs.extend(page.runs);
        if page.next_page_token.is_empty() {
            return runs;
        }
        request.page_token = page.next_page_token;
    }
}

fn ids(runs: &[Run]) -> Vec<&str> {
    runs.iter().map(|r| r.run_id.as_str()).collect()
}

async fn search(client: &mut TestClient, text: &str) -> Vec<String> {
    let runs = walk(
        client,
        ListRunsRequest {
            search: text.to_owned(),
            ..Default::default()
        },
    )
    .await;
    let mut keys: Vec<String> = runs.into_iter().map(|r| r.idempotency_key).collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn list_runs_filters_by_workflow_version() {
    let (_server, mut client) = server_and_client().await;
    assert_eq!(client.register(IDLE_V1).await, 1);
    assert_eq!(client.register(IDLE_V2).await, 2);
    let v1 = start(&mut client, "idle", 1, "").await;
    let v2 = [
        start(&mut client, "idle", 2, "").await,
        start(&mut client, "idle", 2, "").await,
    ];
    let version = |workflow_version| ListRunsRequest {
        workflow_name: "idle".to_owned(),
        workflow_version,
        ..Default::default()
    };
    assert_eq!(ids(&walk(&mut client, version(1)).await), [v1.as_str()]);
    assert_eq!(
        ids(&walk(&mut client, version(2)).await),
        [v2[1].as_str(), v2[0].as_str()],
        "newest first"
    );
    assert_eq!(
        walk(&mut client, version(0)).await.len(),
        3,
        "0: any version"
    );
    assert!(walk(&mut client, version(3)).await.is_empty());
}

#[tokio::test]
async fn search_finds_a_run_by_id_and_runs_by_key_prefix_without_wildcards() {
    let (_server, mut client) = server_and_client().await;
    client.register(IDLE_V1).await;
    let keys = [
        "order-100",
        "order-1001",
        "order-200",
        "100%_off",
        "100x_off",
        "a_b",
        "axb",
        r"back\slash",
    ];
    let mut by_key = BTreeMap::new();
    for key in keys {
        by_key.insert(key, start(&mut client, "idle", 0, key).await);
    }
    let no_key = start(&mut client, "idle", 0, "").await;

    assert_eq!(
        search(&mut client, "order-100").await,
        ["order-100", "order-1001"]
    );
    assert_eq!(search(&mut client, "order-").await.len(), 3);
    assert_eq!(
        search(&mut client, "100%").await,
        ["100%_off"],
        "% is literal"
    );
    assert_eq!(search(&mut client, "%").await, Vec::<String>::new());
    assert_eq!(search(&mut client, "a_").await, ["a_b"], "_ is literal");
    assert_eq!(search(&mut client, "_").await, Vec::<String>::new());
    assert_eq!(search(&mut client, r"back\").await, [r"back\slash"]);
    assert_eq!(
        search(&mut client, "ORDER").await,
        Vec::<String>::new(),
        "case counts"
    );

    // a run id finds exactly that run, with or without a key
    for id in [&no_key, &by_key["axb"]] {
        let found = walk(
            &mut client,
            ListRunsRequest {
                search: id.clone(),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(ids(&found), [id.as_str()]);
    }
    // a prefix of a run id is not a run id
    let prefix = &no_key[..8];
    assert!(search(&mut client, prefix).await.is_empty());
    // search combines with the other filters
    let counted = client
        .runs
        .count_runs(CountRunsRequest {
            search: "order-".to_owned(),
            workflow_name: "idle".to_owned(),
            ..Default::default()
        })
        .await
        .expect("count")
        .into_inner();
    assert_eq!(counted.counts.len(), 1);
    assert_eq!(counted.counts[0].status(), RunStatus::Running);
    assert_eq!(counted.counts[0].count, 3);
}

#[tokio::test]
async fn count_runs_matches_a_list_runs_walk_by_status() {
    let (_server, mut client) = server_and_client().await;
    client.register(IDLE_V1).await;
    client.register(QUICK).await;
    let mut idle = Vec::new();
    for n in 0..5 {
        idle.push(start(&mut client, "idle", 0, &format!("idle-{n}")).await);
    }
    for id in &idle[..2] {
        client
            .runs
            .cancel_run(CancelRunRequest {
                run_id: id.clone(),
                reason: "test".to_owned(),
            })
            .await
            .expect("cancel");
    }
    for _ in 0..3 {
        let id = client.start("quick", json!({})).await;
        client.wait_done(&id, Duration::from_secs(60)).await;
    }

    for (list, count) in [
        (ListRunsRequest::default(), CountRunsRequest::default()),
        (
            ListRunsRequest {
                workflow_name: "idle".to_owned(),
                ..Default::default()
            },
            CountRunsRequest {
                workflow_name: "idle".to_owned(),
                ..Default::default()
            },
        ),
        (
            ListRunsRequest {
                search: "idle-".to_owned(),
                workflow_name: "idle".to_owned(),
                workflow_version: 1,
                ..Default::default()
            },
            CountRunsRequest {
                search: "idle-".to_owned(),
                workflow_name: "idle".to_owned(),
                workflow_version: 1,
                ..Default::default()
            },
        ),
    ] {
        let mut walked = BTreeMap::<i32, i64>::new();
        for run in walk(&mut client, list.clone()).await {
            *walked.entry(run.status).or_default() += 1;
        }
        let counted: BTreeMap<i32, i64> = client
            .runs
            .count_runs(count)
            .await
            .expect("count")
            .into_inner()
            .counts
            .into_iter()
            .map(|c| (c.status, c.count))
            .collect();
        assert_eq!(counted, walked, "{list:?}");
    }
    let all: Vec<(RunStatus, i64)> = client
        .runs
        .count_runs(CountRunsRequest::default())
        .await
        .expect("count")
        .into_inner()
        .counts
        .iter()
        .map(|c| (c.status(), c.count))
        .collect();
    assert_eq!(
        all,
        [
            (RunStatus::Running, 3),
            (RunStatus::Completed, 3),
            (RunStatus::Cancelled, 2)
        ],
        "statuses with runs only, in RunStatus order"
    );
}

#[tokio::test]
async fn bad_filters_are_refused_by_list_and_count_alike_naming_the_field() {
    let (_server, mut client) = server_and_client().await;
    let cases = [
        (
            "idle",
            -1,
            String::new(),
            "workflow_version",
            "a negative version",
        ),
        (
            "",
            2,
            String::new(),
            "workflow_version",
            "a version without a workflow",
        ),
        ("", 0, "k".repeat(257), "search", "a search over 256 bytes"),
        ("", 0, "a\0b".to_owned(), "search", "a NUL in the search"),
        (
            "bad name!",
            0,
            String::new(),
            "workflow_name",
            "a bad workflow name",
        ),
    ];
    for (workflow_name, workflow_version, search, field, why) in cases {
        let listed = client
            .runs
            .list_runs(ListRunsRequest {
                workflow_name: workflow_name.to_owned(),
                workflow_version,
                search: search.clone(),
                ..Default::default()
            })
            .await
            .expect_err(why);
        let counted = client
            .runs
            .count_runs(CountRunsRequest {
                workflow_name: workflow_name.to_owned(),
                workflow_version,
                search: search.clone(),
                ..Default::default()
            })
            .await
            .expect_err(why);
        for status in [&listed, &counted] {
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{why}");
            assert_eq!(violated_field(status), field, "{why}");
        }
        assert_eq!(listed.message(), counted.message(), "{why}");
    }
    // 256 bytes is still a search
    client
        .runs
        .list_runs(ListRunsRequest {
            search: "k".repeat(256),
            ..Default::default()
        })
        .await
        .expect("256 bytes are allowed");
}
