package composer

import (
	"context"
	"iter"
)

// pageFetch makes one call of a paged RPC: for a page token ("" for the
// first page) it returns the page and the next page's token, empty on the
// last page.
type pageFetch[P any] func(ctx context.Context, pageToken string) (page P, next string, err error)

// pages iterates over the pages of a paged RPC in order, each fetched with
// the Client's call context (token, default timeout) when the previous one
// has been consumed, so a caller that stops early fetches no more. It stops
// at the first error, which it yields converted to an *Error.
func pages[P any](ctx context.Context, c *Client, fetch pageFetch[P]) iter.Seq2[P, error] {
	return func(yield func(P, error) bool) {
		token := ""
		for {
			callCtx, cancel := c.callContext(ctx)
			page, next, err := fetch(callCtx, token)
			cancel()
			if err != nil {
				var none P
				yield(none, convertError(err))
				return
			}
			if !yield(page, nil) || next == "" {
				return
			}
			token = next
		}
	}
}

// paged iterates over the items of a paged RPC, page after page (pages).
func paged[T any](ctx context.Context, c *Client, fetch pageFetch[[]T]) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for items, err := range pages(ctx, c, fetch) {
			if err != nil {
				var none T
				yield(none, err)
				return
			}
			for _, item := range items {
				if !yield(item, nil) {
					return
				}
			}
		}
	}
}

// convertAll converts each message of a page to the SDK's model.
func convertAll[M, T any](messages []M, convert func(M) T) []T {
	out := make([]T, 0, len(messages))
	for _, m := range messages {
		out = append(out, convert(m))
	}
	return out
}
