// What each drawn node shows of a run: its own state, and for a MAP the progress of its elements
// (`<map id>[<index>]` entries of the run's node states).
import type { NodeState, NodeStatus } from "@composer-dev/composer/web";

export interface NodeView {
  /** NOT_STARTED: the run has not reached the node (no state yet). */
  status: NodeStatus | "NOT_STARTED";
  attempt: number;
  /** MAP only: element states, by index. */
  elements: NodeState[];
}

const ELEMENT = /^(.*)\[(\d+)\]$/;

export function nodeViews(states: readonly NodeState[]): Map<string, NodeView> {
  const views = new Map<string, NodeView>();
  const view = (id: string): NodeView => {
    let v = views.get(id);
    if (!v) views.set(id, (v = { status: "NOT_STARTED", attempt: 0, elements: [] }));
    return v;
  };
  for (const state of states) {
    const element = ELEMENT.exec(state.nodeId);
    if (element?.[1] !== undefined) {
      view(element[1]).elements[Number(element[2])] = state;
    } else {
      const v = view(state.nodeId);
      v.status = state.status;
      v.attempt = state.attempt;
    }
  }
  return views;
}

export function statusClass(status: NodeView["status"]): string {
  return `status-${status.toLowerCase().replace(/_/g, "-")}`;
}

export function statusLabel(status: NodeView["status"]): string {
  return status === "NOT_STARTED" ? "not started" : status.toLowerCase();
}
