// Exponential back-off with jitter, for the SDK's retries of failed RPCs.

/** Options of {@link Backoff}; every duration is in milliseconds. */
export interface BackoffOptions {
  /** The cap of the first delay (default 100 ms). */
  initialMs?: number;
  /** How much the cap grows with each failure (default 2). */
  multiplier?: number;
  /** The largest cap (default 10 s). */
  maximumMs?: number;
  /** The fraction of the cap that is random: 0 none, 1 full jitter (default 0.5). */
  jitter?: number;
}

/**
 * Delays between retries: `min(initial * multiplier^(n-1), maximum)` before retry `n`, reduced by
 * a random part of up to `jitter` of itself. With the default jitter of 0.5 the delay before retry
 * `n` lies in `[cap/2, cap]`: retries of many workers spread out while the delay still grows.
 */
export class Backoff {
  readonly initialMs: number;
  readonly multiplier: number;
  readonly maximumMs: number;
  readonly jitter: number;

  constructor(options: BackoffOptions = {}) {
    this.initialMs = options.initialMs ?? 100;
    this.multiplier = options.multiplier ?? 2;
    this.maximumMs = options.maximumMs ?? 10_000;
    this.jitter = options.jitter ?? 0.5;
    if (!(this.initialMs > 0) || this.maximumMs < this.initialMs) throw new RangeError("Backoff needs 0 < initialMs <= maximumMs");
    if (!(this.multiplier >= 1)) throw new RangeError("Backoff.multiplier must be at least 1");
    if (!(this.jitter >= 0 && this.jitter <= 1)) throw new RangeError("Backoff.jitter must be within [0, 1]");
  }

  /** The largest delay after `failures` consecutive failures (from 1). */
  cap(failures: number): number {
    if (failures < 1) throw new RangeError("failures counts from 1");
    let cap = this.initialMs;
    for (let i = 0; i < Math.min(failures - 1, 256); i++) {
      cap *= this.multiplier;
      if (cap >= this.maximumMs) return this.maximumMs;
    }
    return Math.min(cap, this.maximumMs);
  }

  /** The delay in ms before the next try after `failures` consecutive failures; `rand` returns [0, 1). */
  delay(failures: number, rand: () => number = Math.random): number {
    return this.cap(failures) * (1 - this.jitter * rand());
  }
}
