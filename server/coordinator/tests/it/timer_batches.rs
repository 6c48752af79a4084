//! A batch of due timers is fired in one transaction whose runs are all
//! written in one statement (decision 0026). Each run must end exactly as
//! when its timer fires alone: a WAIT that arms a task, a WAIT that ends
//! its run, a child run whose end tells its parent, an event's timeout,
//! and a run's own timeout, which cancels its live task.

use crate::common;

use std::collections::BTreeMap;

use composer_coordinator::{Coordinator, CoordinatorConfig};
use composer_store::timers;
use serde_json::json;

const WORKFLOWS: [&str; 6] = [
    "name: wait_then_task\nnodes:\n  - { id: pause, type: WAIT, duration: 1h }\n  - { id: work, type: TASK, queue: timed, task: work }\nedges:\n  - { from: pause, to: work }\n",
    "name: wait_then_end\nnodes:\n  - { id: pause, type: WAIT, duration: 1h }\n",
    "name: child_wait\nnodes:\n  - { id: pause, type: WAIT, duration: 1h }\noutput: { n: \"${input.n}\" }\n",
    "name: parent\nnodes:\n  - { id: child, type: SUB_WORKFLOW, workflow: child_wait }\n",
    "name: event_timeout\nnodes:\n  - { id: approval, type: WAIT_FOR_EVENT, event: approval, timeout: 1h }\n",
    "name: run_timeout\ntimeout: 1h\nnodes:\n  - { id: work, type: TASK, queue: timed, task: work }\n",
];

/// Runs of each kind, so a batch holds several of every one.
const RUNS_PER_KIND: i64 = 6;

/// Every run started, its timers made due, and fired: all in one call to
/// `fire_timers`, or one call per timer. Returns the snapshots by run.
async fn fire(together: bool) -> BTreeMap<(String, i64), String> {
    let coordinator = Coordinator::new(common::fresh_store(8).await, CoordinatorConfig::default());
    for definition in WORKFLOWS {
        coordinator
            .workflows()
            .register(coordinator.store(), "default", definition)
            .await
            .expect("register");
    }
    for name in [
        "wait_then_task",
        "wait_then_end",
        "parent",
        "event_timeout",
        "run_timeout",
    ] {
        for n in 0..RUNS_PER_KIND {
            coordinator
                .start_run(common::start_request(name, json!({ "n": n })))
                .await
                .expect("start");
        }
    }
    let pool = coordinator.store().pool();
    // the children start from the parents' inboxes, after their commits
    let mut children = 0;
    for _ in 0..100 {
        children = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM timers t JOIN runs r ON r.id = t.run_id \
             WHERE r.workflow_name = 'child_wait'",
        )
        .fetch_one(pool)
        .await
        .expect("children");
        if children == RUNS_PER_KIND {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(children, RUNS_PER_KIND, "every child waits");
    sqlx::query("UPDATE timers SET fire_at = now() - interval '1 second'")
        .execute(pool)
        .await
        .expect("due");

    let due = timers::due_timers(pool, 1_000).await.expect("due timers");
    assert_eq!(due.len() as i64, 5 * RUNS_PER_KIND, "{due:?}");
    let fired = if together {
        coordinator.fire_timers(&due).await.expect("fire")
    } else {
        let mut fired = 0;
        for timer in &due {
            fired += coordinator
                .fire_timers(std::slice::from_ref(timer))
                .await
                .expect("fire one");
        }
        fired
    };
    assert_eq!(fired, due.len());
    settle_parents(&coordinator).await;
    snapshots(&coordinator).await
}

/// Waits until every parent has taken its child's end from its inbox.
async fn settle_parents(coordinator: &Coordinator) {
    for _ in 0..100 {
        let running: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM runs WHERE workflow_name = 'parent' AND status = 'RUNNING'",
        )
        .fetch_one(coordinator.store().pool())
        .await
        .expect("parents");
        if running == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// What each run left in every table a write touches, without ids and
/// times, with its output and event waits, by its workflow and input.
async fn snapshots(coordinator: &Coordinator) -> BTreeMap<(String, i64), String> {
    let pool = coordinator.store().pool();
    let runs: Vec<(uuid::Uuid, String, i64, Option<serde_json::Value>)> =
        sqlx::query_as("SELECT id, workflow_name, (input->>'n')::bigint, output FROM runs")
            .fetch_all(pool)
            .await
            .expect("runs");
    let mut snapshots = BTreeMap::new();
    for (id, workflow, n, output) in runs {
        let waits: i64 = sqlx::query_scalar("SELECT count(*) FROM event_waits WHERE run_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .expect("waits");
        let tables = common::run_snapshot(pool, id).await;
        snapshots.insert(
            (workflow, n),
            format!("{tables}\noutput {output:?} waits {waits}"),
        );
    }
    snapshots
}

#[tokio::test]
async fn timers_fired_in_one_batch_end_their_runs_as_timers_fired_alone() {
    let together = fire(true).await;
    let alone = fire(false).await;
    assert_eq!(together.len() as i64, 6 * RUNS_PER_KIND);
    for (run, snapshot) in &together {
        assert_eq!(Some(snapshot), alone.get(run), "{run:?}");
    }
    let run = |workflow: &str| together[&(workflow.to_owned(), 0)].clone();
    assert!(run("wait_then_task").starts_with("(\"RUNNING\""));
    for ended in ["wait_then_end", "child_wait", "parent"] {
        assert!(run(ended).starts_with("(\"COMPLETED\""), "{}", run(ended));
    }
    for failed in ["event_timeout", "run_timeout"] {
        assert!(run(failed).starts_with("(\"FAILED\""), "{}", run(failed));
    }
    // the task a WAIT armed is out; the timed-out run's task is cancelled
    let tasks = |workflow: &str| run(workflow).lines().nth(3).unwrap_or_default().to_owned();
    assert!(
        tasks("wait_then_task").contains("(\"work\", \"DISPATCHED\""),
        "{}",
        run("wait_then_task")
    );
    assert!(
        tasks("run_timeout").contains("CANCELLED"),
        "{}",
        run("run_timeout")
    );
    // the event's wait went with its timeout
    assert!(
        run("event_timeout").ends_with("waits 0"),
        "{}",
        run("event_timeout")
    );
    // the child's output is its own
    assert!(
        run("child_wait").contains("output Some(Object {\"n\""),
        "{}",
        run("child_wait")
    );
}
