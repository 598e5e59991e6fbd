package pipeline

import (
	"context"
	"sync"
)

// slotQueue is the queue of messages from one slot's producer to the mixer: a ring
// that grows with what is queued, and a signal for the mixer when it was empty. It
// has no bound of its own: the slot's semaphore bounds it by bytes, and a queue of
// small samples must not stop at a message count first (see send). Its fixed cost
// does not depend on the slot's byte budget, so that opening a shard of a few
// samples costs little whatever the budget: a channel sized for the budget cost
// more than reading such a shard (makechan zeroing its buffer).
//
// One goroutine pushes and closes, one pops.
type slotQueue struct {
	mu     sync.Mutex
	ring   []slotMsg // len(ring) is the capacity: a power of two, or 0 before the first push
	head   int       // the oldest message
	n      int       // messages queued
	closed bool
	ready  chan struct{} // holds a token after a push onto an empty queue, or the close
}

// minQueueRing is the ring's first capacity: a small shard's samples, without growing.
const minQueueRing = 8

// init readies q to signal ready (a channel of capacity 1, which several queues may
// share: their consumer then looks at each after a signal), or a channel of its own
// when ready is nil.
func (q *slotQueue) init(ready chan struct{}) {
	if ready == nil {
		ready = make(chan struct{}, 1)
	}
	q.ready = ready
}

// push queues m; it never blocks.
func (q *slotQueue) push(m slotMsg) {
	q.mu.Lock()
	if q.n == len(q.ring) {
		q.grow()
	}
	q.ring[(q.head+q.n)&(len(q.ring)-1)] = m
	q.n++
	wake := q.n == 1
	q.mu.Unlock()
	if wake {
		q.signal()
	}
}

// grow doubles the ring, keeping the messages in order. Called with q.mu held.
func (q *slotQueue) grow() {
	ring := make([]slotMsg, max(2*len(q.ring), minQueueRing))
	k := copy(ring, q.ring[q.head:])
	copy(ring[k:], q.ring[:q.head])
	q.ring, q.head = ring, 0
}

// close marks the end of the messages: pop reports it once the queue is empty.
func (q *slotQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}

func (q *slotQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default: // a token is pending: the mixer has yet to look
	}
}

// tryPop takes the oldest message; ok is false when the queue is empty, and closed
// then says whether it has ended.
func (q *slotQueue) tryPop() (m slotMsg, ok, closed bool) {
	q.mu.Lock()
	if q.n == 0 {
		closed = q.closed
		q.mu.Unlock()
		return m, false, closed
	}
	m = q.ring[q.head]
	q.ring[q.head] = slotMsg{} // the sample is the mixer's now: the ring keeps no reference
	q.head = (q.head + 1) & (len(q.ring) - 1)
	q.n--
	q.mu.Unlock()
	return m, true, false
}

// pop waits for the oldest message, as a receive from a channel would: ok is false
// once the queue is closed and empty. It returns ctx's error when ctx is done first,
// without taking a message.
func (q *slotQueue) pop(ctx context.Context) (m slotMsg, ok bool, err error) {
	done := ctx.Done()
	for {
		select {
		case <-done:
			return m, false, ctx.Err()
		default:
		}
		var closed bool
		if m, ok, closed = q.tryPop(); ok || closed {
			return m, ok, nil
		}
		// Empty: the next push, or the close, leaves a token (one may be left over
		// from a push whose message was already taken; the loop then looks again).
		select {
		case <-q.ready:
		case <-done:
			return m, false, ctx.Err()
		}
	}
}

// len returns the number of messages queued.
func (q *slotQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}
