// Package composer is the Go SDK of Composer, a distributed workflow
// engine: a Client to register workflows, start and steer runs and wait for
// their results, and a Worker that runs task handlers for the tasks the
// server leases to it.
//
// The generated package gen/composer/v1 is the wire layer; this package is
// the interface to program against.
//
// # A worker
//
//	client, err := composer.Dial(ctx, "127.0.0.1:7070") // token: COMPOSER_TOKEN
//	if err != nil { ... }
//	defer client.Close()
//	w := composer.NewWorker(client, composer.WorkerOptions{Slots: 8})
//	w.Handle("greetings", "hello", composer.Typed(func(ctx context.Context, in Greeting) (Reply, error) {
//		return Reply{Text: "hello " + in.Name}, nil
//	}))
//	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//	defer stop()
//	err = w.Run(ctx) // until SIGTERM: stop polling, drain, stop heartbeating
//
// The worker never shows a lease to a handler. It long-polls its queues for
// as many tasks as it has free slots, confirms the receipt of each attempt
// still running a third of the way to its first, short expiry with an early
// heartbeat (so a poll answer lost on the way costs no attempt), heartbeats
// each running attempt at a third of its lease, reports the outcome with
// the lease's fencing token, sends a report again with the same token after
// UNAVAILABLE, DEADLINE_EXCEEDED or a busy server (RESOURCE_EXHAUSTED with
// reason QUOTA_EXCEEDED or CPU_POOL_BUSY), and drops it for good after
// LEASE_LOST.
//
// # Cancellation
//
// A handler's context is done when the attempt must stop; context.Cause
// says why: ErrRunCancelled (a heartbeat learnt that the run was
// cancelled; the cause is a *RunCancelledError whose Reason, also
// CancelReason(ctx), is the reason given to CancelRun), ErrLeaseLost ("lease lost"), ErrAttemptTimeout (the
// node's timeout, also the context's deadline) or ErrWorkerShutdown (the
// worker stopped and the drain timed out). After a cancelled run or a lost
// lease nothing is reported for the attempt, whatever the handler returns.
//
// # Failures
//
// A handler fails its attempt by returning an error. A *TaskError chooses
// the code, the retryability and the details; NonRetryable(err) makes any
// error final; any other error is retryable, its code the Go type of the
// first error in its chain that a program declared (e.g. fs.PathError), else
// ERROR (DefaultErrorCode: errors.New, fmt.Errorf), and its details the
// error chain. A panic is a
// retryable failure with code PANIC and the stack in its details; it never
// crashes the worker.
//
// # Tracing
//
// With OpenTelemetry, each handler runs in a span "task <name>" that
// continues the server's lease span (Task.trace_context, W3C); the
// attempt's report carries that span's traceparent back, and StartRun
// carries the caller's. WorkerOptions.TracerProvider, else the global
// provider, makes the spans.
//
// # Bulk actions
//
// BulkCancelRuns, BulkRetryRuns, BulkPauseRuns and BulkResumeRuns act on
// every run a RunFilter matches, as a long-running BulkOperation that the
// servers work through a batch at a time; WaitBulkOperation polls it until
// it ends, and GetBulkOperation, ListBulkOperations and CancelBulkOperation
// read and stop it. MigrateRuns is one too: it moves a workflow's runs in
// flight to another version where the version is compatible with them.
//
// # Versions and replay
//
// ReplayRun replays a run's recorded history against a new definition
// (ReplayOptions: a Source or a registered Version, and renamed nodes) and
// answers a RunReplay: ReplayIdentical, ReplayCompatible with its
// differences, ReplayIncompatible with the first divergence, or
// ReplayUnreplayable. The run is RunByID(id), or a *RecordedRun that
// ParseRecordedRun reads from what `composer run history RUN_ID -o json`
// wrote. CheckWorkflowVersion replays every run in flight of a workflow
// (or its completed runs) and adds the verdicts up.
//
// # Queue rate limits and concurrency keys
//
// SetQueueRateLimit, GetQueueRateLimit, ListQueueRateLimits and
// DeleteQueueRateLimit hold a queue's QueueRateLimit: dispatch hands its
// tasks to workers no faster than it allows, on every server at once. A
// run of a workflow whose concurrency key is at its limit is RunQueued
// until a run of its key ends; Run.ConcurrencyKey shows its key.
//
// # Secrets
//
// SetSecret, ListSecrets and DeleteSecret keep the namespace's secrets,
// the credentials HTTP and CODE nodes use as ${secrets.NAME}. A Secret
// carries a name, a version and times, never a value: no call returns one.
//
// # Large payloads
//
// A value whose compact JSON is longer than the server's offload threshold
// (ServerInfo.PayloadOffloadBytes) lives in the namespace's blob store and
// travels as a reference, {"$blob": {"sha256", "size", "head"}}. StartRun
// and SendEvent upload such an input or payload and send its reference; a
// Worker resolves every reference in a task's input before its handler
// runs and uploads a large output; WaitForResult and RunWorkflow resolve
// the output they return. GetRun and the history show references as
// stored: ResolvePayload, DownloadBlob and UploadBlob work with them
// directly (BlobRef, ParseBlobRef). When the server's blob store is a
// bucket that signs URLs (ServerInfo.BlobURLs), the bytes move straight
// between the SDK and the store, with one HTTP PUT or GET of a short-lived
// URL the server gives (never logged), and through the server's streams
// otherwise.
//
// # Errors of calls
//
// Every failed call returns an *Error (use errors.As) with the gRPC code,
// the field violations of an invalid request and the ErrorInfo reason, and
// helpers such as IsNotFound, IsInvalidArgument, IsFailedPrecondition and
// IsLeaseLost. WaitForResult returns a *RunFailedError for a run that ended
// FAILED or CANCELLED, and ctx's error (context.DeadlineExceeded) when ctx
// ends first.
package composer
