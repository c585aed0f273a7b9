package main

import (
	"context"
	"errors"
	"io"

	"github.com/sluicehq/sluice/internal/ctl"
)

// runCtl runs "sluice ctl" (package ctl); its exit statuses pass through.
func runCtl(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	err := ctl.Run(ctx, args, getenv, stdout, stderr)
	var ee ctl.ExitError
	if errors.As(err, &ee) {
		return exitError{ee.Code}
	}
	return err
}
