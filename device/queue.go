package device

import "sync"

// serial runs handle on pushed items one at a time, in push order, in a
// goroutine that exists only while there is work: an idle device costs no
// goroutine. Pushing never blocks, so an MQTT callback can hand a message
// over and return at once. Once done is closed, what is still waiting is
// dropped and no goroutine starts any more.
type serial[T any] struct {
	handle func(T)
	done   <-chan struct{}
	wg     *sync.WaitGroup

	mu      sync.Mutex
	items   []T
	running bool
	stopped bool
}

func newSerial[T any](done <-chan struct{}, wg *sync.WaitGroup, handle func(T)) *serial[T] {
	return &serial[T]{handle: handle, done: done, wg: wg}
}

func (s *serial[T]) push(v T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.closed() {
		return
	}
	s.items = append(s.items, v)
	if !s.running {
		s.running = true
		s.wg.Add(1)
		go s.drain()
	}
}

func (s *serial[T]) drain() {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		if len(s.items) == 0 || s.stopped || s.closed() {
			s.running = false
			s.items = nil
			s.mu.Unlock()
			return
		}
		v := s.items[0]
		var zero T
		s.items[0] = zero
		s.items = s.items[1:]
		s.mu.Unlock()
		s.handle(v)
	}
}

// stop refuses further pushes; after it returns, wg.Add is no longer
// called, so wg.Wait is safe.
func (s *serial[T]) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
}

func (s *serial[T]) closed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}
