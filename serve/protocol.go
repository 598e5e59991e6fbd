package serve

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/shardload/shardload/wire"
)

// The protocol's versions, limits and error codes, defined in package wire (which
// holds the messages): Version is the newest protocol version this server speaks
// (docs/protocol.md), MinVersion the oldest it accepts, MaxMessage the largest
// message either side may send.
const (
	Version    = wire.Version
	MinVersion = wire.MinVersion
	MaxMessage = wire.MaxMessage

	CodeVersion    = wire.CodeVersion
	CodeDenied     = wire.CodeDenied
	CodeBadRequest = wire.CodeBadRequest
	CodeBusy       = wire.CodeBusy
	CodePipeline   = wire.CodePipeline
	CodeShutdown   = wire.CodeShutdown
	CodeResume     = wire.CodeResume
)

// errProtocol marks a message the server cannot accept.
var errProtocol = errors.New("serve: protocol error")

func decodeMessage(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %v", errProtocol, err)
	}
	return nil
}
