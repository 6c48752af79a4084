// Data hooks: a poll for lists (live refresh), the WatchRun stream for one run, and a run's history.
import { useCallback, useEffect, useRef, useState } from "react";
import type { HistoryEvent, Run } from "@composer-dev/composer/web";

import { errorText, isUnauthenticatedError, rawMessage } from "./api";
import { useApp } from "./context";

export interface Loaded<T> {
  data: T | null;
  error: string | null;
  loading: boolean;
  reload: () => void;
}

/**
 * Loads with `load` when `key` changes, and again every `intervalMs` while `live` (a slow answer
 * is never overlapped by the next poll). The last data stays shown while the next loads.
 */
export function usePolled<T>(load: (signal: AbortSignal) => Promise<T>, key: string, options: { live?: boolean; intervalMs?: number } = {}): Loaded<T> {
  const [data, setData] = useState<T | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [loading, setLoading] = useState(true);
  const [tick, setTick] = useState(0);
  const loadRef = useRef(load);
  loadRef.current = load;
  const live = options.live ?? false;
  const intervalMs = options.intervalMs ?? 3000;

  useEffect(() => {
    const controller = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const run = async (): Promise<void> => {
      try {
        const value = await loadRef.current(controller.signal);
        if (controller.signal.aborted) return;
        setData(value);
        setError(null);
      } catch (e) {
        if (controller.signal.aborted) return;
        // the client's interceptor has already sent the user back to log in
        if (isUnauthenticatedError(e)) return;
        setError(errorText(e));
      } finally {
        if (!controller.signal.aborted) setLoading(false);
      }
      if (live && !controller.signal.aborted) timer = setTimeout(() => void run(), intervalMs);
    };
    void run();
    return () => {
      controller.abort();
      clearTimeout(timer);
    };
  }, [key, tick, live, intervalMs]);

  const reload = useCallback(() => setTick((t) => t + 1), []);
  return { data, error, loading, reload };
}

/** The run, live: WatchRun's snapshots over grpc-web until the run ends (the SDK reconnects). */
export function useWatchedRun(runId: string): { run: Run | null; error: string | null; restart: () => void } {
  const { client, expire } = useApp();
  const [run, setRun] = useState<Run | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [generation, setGeneration] = useState(0);
  useEffect(() => {
    const controller = new AbortController();
    setError(null);
    void (async () => {
      try {
        for await (const snapshot of client.watchRun(runId, { signal: controller.signal })) setRun(snapshot);
      } catch (e) {
        if (controller.signal.aborted) return;
        // a stream's error reaches no interceptor: end the session here
        if (isUnauthenticatedError(e)) return expire(rawMessage(e));
        setError(errorText(e));
      }
    })();
    return () => controller.abort();
  }, [client, runId, generation, expire]);
  // a retried run is RUNNING again after its watch ended: watch it anew
  const restart = useCallback(() => setGeneration((g) => g + 1), []);
  return { run, error, restart };
}

const HISTORY_LIMIT = 5000;

/** The run's history, loaded again whenever `version` (the run's update time) changes. */
export function useHistory(runId: string, version: string): Loaded<HistoryEvent[]> {
  const { client } = useApp();
  return usePolled(
    async (signal) => {
      const events: HistoryEvent[] = [];
      for await (const event of client.getRunHistory(runId, { pageSize: 1000, signal })) {
        events.push(event);
        if (events.length >= HISTORY_LIMIT) break;
      }
      return events;
    },
    `${runId}@${version}`,
  );
}
