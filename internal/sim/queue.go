package sim

import "sync"

// queue is an unbounded FIFO with a blocking pop. Pushing never blocks, so
// an MQTT callback can hand a message over and return at once.
type queue[T any] struct {
	mu     sync.Mutex
	items  []T
	signal chan struct{}
}

func newQueue[T any]() *queue[T] { return &queue[T]{signal: make(chan struct{}, 1)} }

func (q *queue[T]) push(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// pop returns the oldest item, waiting for one; false once done is closed.
func (q *queue[T]) pop(done <-chan struct{}) (T, bool) {
	for {
		select {
		case <-done:
			var zero T
			return zero, false
		default:
		}
		q.mu.Lock()
		if len(q.items) > 0 {
			v := q.items[0]
			var zero T
			q.items[0] = zero
			q.items = q.items[1:]
			q.mu.Unlock()
			return v, true
		}
		q.mu.Unlock()
		select {
		case <-q.signal:
		case <-done:
			var zero T
			return zero, false
		}
	}
}
