package engine

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"path"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// ImageID is the engine's ID of the image ref.
func (e *Engine) ImageID(ctx context.Context, ref string) (string, error) {
	res, err := e.cli.Client().ImageInspect(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("looking up image %s: %w", ref, err)
	}
	return res.ID, nil
}

// ImageFile reads the first of paths that is a file in image, through a
// container of it that is created (never started) and removed at once. A
// symbolic link is followed within the image, a few times at most.
func (e *Engine) ImageFile(ctx context.Context, image string, paths []string, max int64) (string, []byte, error) {
	c := e.cli.Client()
	res, err := c.ContainerCreate(ctx, client.ContainerCreateOptions{
		Image: image,
		Config: &container.Config{
			Labels:     map[string]string{LabelImage: "file-probe"},
			Entrypoint: []string{"/never-started"},
		},
	})
	if err != nil {
		return "", nil, fmt.Errorf("reading %s: %w", image, err)
	}
	defer c.ContainerRemove(context.WithoutCancel(ctx), res.ID, client.ContainerRemoveOptions{Force: true})
	for _, p := range paths {
		for range 8 { // links followed
			data, link, err := e.readFile(ctx, res.ID, p, max)
			switch {
			case cerrdefs.IsNotFound(err):
			case err != nil:
				return "", nil, fmt.Errorf("reading %s in %s: %w", p, image, err)
			case link != "":
				if !path.IsAbs(link) {
					link = path.Join(path.Dir(p), link)
				}
				p = link
				continue
			default:
				return p, data, nil
			}
			break
		}
	}
	return "", nil, nil
}

// readFile reads the file p of container id, or the target of the link p
// is.
func (e *Engine) readFile(ctx context.Context, id, p string, max int64) (data []byte, link string, err error) {
	res, err := e.cli.Client().CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: p})
	if err != nil {
		return nil, "", err
	}
	defer res.Content.Close()
	tr := tar.NewReader(res.Content)
	hdr, err := tr.Next()
	if err != nil {
		return nil, "", err
	}
	switch hdr.Typeflag {
	case tar.TypeSymlink:
		return nil, hdr.Linkname, nil
	case tar.TypeReg:
	default:
		return nil, "", fmt.Errorf("%s is not a file", p)
	}
	if hdr.Size > max {
		return nil, "", fmt.Errorf("%s is larger than %d bytes", p, max)
	}
	data, err = io.ReadAll(io.LimitReader(tr, max))
	if err != nil {
		return nil, "", err
	}
	return data, "", nil
}
