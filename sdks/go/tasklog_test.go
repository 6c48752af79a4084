package composer

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// A task's Logger writes what Logger.With would have: the task's attributes
// first, then the record's, in groups opened after it too.
func TestTaskLoggerWritesAsWithWould(t *testing.T) {
	var lazy, eager bytes.Buffer
	opts := &slog.HandlerOptions{Level: slog.LevelInfo, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}
	attrs := []any{"task_id", "t1", "attempt", 2, "run_id", "r", "node_id", "n", "task", "step"}
	for _, l := range []*slog.Logger{
		taskLogger(slog.New(slog.NewTextHandler(&lazy, opts)).With("worker_id", "w"), slog.String("task_id", "t1"), slog.Int("attempt", 2), slog.String("run_id", "r"), slog.String("node_id", "n"), slog.String("task", "step")),
		slog.New(slog.NewTextHandler(&eager, opts)).With("worker_id", "w").With(attrs...),
	} {
		l.Info("hello", "k", 1)
		l.Debug("hidden")
		l.With("extra", true).Warn("with", "k", 2)
		l.WithGroup("g").Error("group", "k", 3)
	}
	if lazy.String() != eager.String() {
		t.Errorf("task logger wrote\n%s\nLogger.With writes\n%s", lazy.String(), eager.String())
	}
	if !strings.Contains(lazy.String(), "worker_id=w task_id=t1 attempt=2 run_id=r node_id=n task=step k=1") {
		t.Errorf("unexpected output %s", lazy.String())
	}
}
