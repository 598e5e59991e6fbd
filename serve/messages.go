package serve

// A session's messages: the trainer's read, the server's written, and the connection's end.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/wire"
)

// readLoop reads the trainer's messages until it leaves or the session ends:
// releases free slabs, an epoch message starts the next epoch (abandoning the current
// one when it has not ended), bye ends the session.
func (ss *session) readLoop(ctx context.Context, cancel context.CancelCauseFunc) {
	// A blocked read ends when the session does.
	stop := context.AfterFunc(ctx, func() { ss.conn.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, MaxMessage+1)
	for {
		msg, err := readMessage(ss.conn, buf)
		if err != nil {
			if ctx.Err() == nil {
				var re *requestError
				if errors.As(err, &re) {
					ss.protocolError(cancel, "%s", re.msg)
				} else {
					cancel(errClientGone)
				}
			}
			return
		}
		var env wire.Envelope
		if err := decodeMessage(msg, &env); err != nil {
			ss.protocolError(cancel, "%v", err)
			return
		}
		ss.mu.Lock()
		early := !ss.readySent
		ss.mu.Unlock()
		if early && env.Type != wire.TypeBye {
			ss.protocolError(cancel, "%q sent before the server's ready", env.Type)
			return
		}
		switch env.Type {
		case wire.TypeRelease:
			var r wire.Release
			if err := decodeMessage(msg, &r); err != nil {
				ss.protocolError(cancel, "release: %v", err)
				return
			}
			if err := ss.release(r); err != nil {
				ss.protocolError(cancel, "%v", err)
				return
			}
		case wire.TypeEpoch:
			var e wire.EpochRequest
			if err := decodeMessage(msg, &e); err != nil || e.Epoch < 0 {
				ss.protocolError(cancel, "epoch: want {\"type\": \"epoch\", \"epoch\": N >= 0}")
				return
			}
			req := epochReq{epoch: e.Epoch}
			if ss.states && e.State != nil {
				st := *e.State
				epoch, err := checkState("epoch", e.Epoch, &st)
				if err != nil {
					ss.protocolError(cancel, "%v", err)
					return
				}
				req = epochReq{epoch: epoch, state: &st}
			}
			if err := ss.askEpoch(req); err != nil {
				ss.protocolError(cancel, "%v", err)
				return
			}
		case wire.TypeBye:
			cancel(errBye)
			return
		default:
			ss.protocolError(cancel, "unexpected message type %q", env.Type)
			return
		}
	}
}

// askEpoch queues the epoch a trainer asks for. When the epoch before it has not
// ended, that one is abandoned: its stream is stopped now.
func (ss *session) askEpoch(req epochReq) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.abandoning || ss.dropRun != 0 {
		return fmt.Errorf("epoch %d asked for before the end of the epoch it abandoned", req.epoch)
	}
	if len(ss.open) > 0 {
		ss.abandoning = true
		if ss.cancelRun != nil {
			ss.cancelRun()
		}
	}
	ss.open = append(ss.open, req)
	ss.starveFrom(time.Now())
	select {
	case ss.wake <- struct{}{}:
	default:
	}
	return nil
}

func (ss *session) protocolError(cancel context.CancelCauseFunc, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	ss.sendError(CodeBadRequest, msg)
	cancel(fmt.Errorf("%w: %s", errProtocol, msg))
}

func (ss *session) sendError(code, msg string) { sendError(ss.conn, code, msg) }

func (ss *session) write(v any, fds []int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > MaxMessage {
		return fmt.Errorf("serve: message of %d bytes exceeds %d", len(b), MaxMessage)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err = ss.conn.WriteMsgUnix(b, oob, nil)
	return err
}

// lingerTime bounds how long a connection's end waits for the trainer to close.
const lingerTime = time.Second

// linger ends a connection so that the trainer reads everything sent to it: closing a
// unix socket with unread messages would reset the connection, and the trainer would
// lose the last messages (an error that says why). It shuts down the sending side,
// reads what the trainer still sends until it closes or lingerTime passes, and closes.
func linger(c *net.UnixConn) {
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(lingerTime))
	buf := make([]byte, MaxMessage+1)
	for {
		if _, err := c.Read(buf); err != nil {
			break
		}
	}
	c.Close()
}

// sendError sends an error message, best effort: the session ends after it. The
// secrets of the URLs it quotes are removed.
func sendError(c *net.UnixConn, code, msg string) {
	b, _ := json.Marshal(wire.ErrorMessage{Type: wire.TypeError, Code: code, Message: redact.String(msg)})
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write(b)
}

// readMessage reads one message into buf, which has room for MaxMessage+1 bytes so
// that a longer message is seen as such.
func readMessage(c *net.UnixConn, buf []byte) ([]byte, error) {
	n, err := c.Read(buf)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, io.EOF
	}
	if n > MaxMessage {
		return nil, reject(CodeBadRequest, "message longer than %d bytes", MaxMessage)
	}
	return buf[:n], nil
}

func oneLine(err error) string {
	b := []byte(err.Error())
	for i, c := range b {
		if c == '\n' {
			b[i] = ' '
		}
	}
	return string(b)
}
