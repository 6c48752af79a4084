package composer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	composer "github.com/composer-dev/composer/sdks/go"
)

// Against the real server: ListWorkflows, ListWorkflowVersions, CountRuns
// and RunWorkflow (start and wait), through the http:// address form.
func TestClientListsCountsAndRunsWorkflows(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 90*time.Second)
	client := dial(t, "http://"+addr)
	queue := "catalog-" + n
	w := composer.NewWorker(client, fast(2))
	w.Handle(queue, "echo", composer.Typed(func(_ context.Context, in map[string]string) (string, error) {
		if in["fail"] != "" {
			return "", composer.NonRetryable(errors.New(in["fail"]))
		}
		return "hello " + in["name"], nil
	}))
	serve(t, w)
	name := "catalog-" + n
	for _, extra := range []string{"", "timeout: 30s"} { // two versions
		if _, err := client.RegisterWorkflow(ctx, oneTask(name, queue, "echo", extra)); err != nil {
			t.Fatal(err)
		}
	}

	var found []*composer.WorkflowSummary
	for s, err := range client.ListWorkflows(ctx, composer.ListWorkflowsOptions{NamePrefix: name}) {
		if err != nil {
			t.Fatal(err)
		}
		found = append(found, s)
	}
	if len(found) != 1 || found[0].Name != name || found[0].LatestVersion != 2 {
		t.Errorf("ListWorkflows: %+v", found)
	}
	var versions []int
	for v, err := range client.ListWorkflowVersions(ctx, name, 1) {
		if err != nil {
			t.Fatal(err)
		}
		versions = append(versions, v.Version)
	}
	if len(versions) != 2 || versions[0] != 2 || versions[1] != 1 {
		t.Errorf("ListWorkflowVersions: %v", versions)
	}
	for _, err := range client.ListWorkflowVersions(ctx, "no-such-"+n, 0) {
		if !composer.IsNotFound(err) {
			t.Errorf("ListWorkflowVersions of an unknown workflow: %v", err)
		}
	}

	var out struct{ Result string }
	run, err := client.RunWorkflow(ctx, name, map[string]string{"name": "Ada"}, &out)
	if err != nil || run.Status != composer.RunCompleted || out.Result != "hello Ada" {
		t.Fatalf("RunWorkflow: %+v %+v %v", run, out, err)
	}
	run, err = client.RunWorkflow(ctx, name, map[string]string{"fail": "no stock"}, nil)
	var failed *composer.RunFailedError
	if !errors.As(err, &failed) || run.Status != composer.RunFailed || failed.Code() != "NON_RETRYABLE" || failed.Message() != "no stock" {
		t.Errorf("RunWorkflow of a failing run: %+v %v", run, err)
	}

	counts, err := client.CountRuns(ctx, composer.RunFilter{Workflow: name})
	if err != nil || counts.ByStatus[composer.RunCompleted] != 1 || counts.ByStatus[composer.RunFailed] != 1 || counts.Total() != 2 || counts.More {
		t.Errorf("CountRuns: %v %v", counts, err)
	}
}
