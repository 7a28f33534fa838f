package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// series is one bar colour: per worker count, median with min and max.
type series struct {
	Name  string
	Color color.RGBA
	Vals  []stats
}

// drawChart draws grouped bars (one group per worker count) with min-max
// whiskers and value labels, and writes a PNG.
func drawChart(path, title string, groups []string, ss []series) error {
	const W, H, left, right, top, bottom = 900, 520, 70, 20, 60, 60
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), &image.Uniform{color.White}, image.Point{}, draw.Src)
	black := color.RGBA{0, 0, 0, 255}
	grey := color.RGBA{220, 220, 220, 255}
	text := func(x, y int, c color.Color, s string) {
		d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	rect := func(x0, y0, x1, y1 int, c color.Color) {
		draw.Draw(img, image.Rect(x0, y0, x1, y1), &image.Uniform{c}, image.Point{}, draw.Src)
	}
	maxV := 0.0
	for _, s := range ss {
		for _, v := range s.Vals {
			maxV = max(maxV, v.Max)
		}
	}
	if maxV == 0 {
		maxV = 1
	}
	// A round axis top.
	step := 1000.0
	for maxV/step > 10 {
		step *= 2
	}
	axisTop := step * float64(int(maxV*1.12/step)+1) // headroom for labels and the legend
	plotH := H - top - bottom
	y := func(v float64) int { return H - bottom - int(v/axisTop*float64(plotH)) }
	for v := 0.0; v <= axisTop+1; v += step {
		rect(left, y(v), W-right, y(v)+1, grey)
		text(5, y(v)+4, black, fmt.Sprintf("%6.0f", v))
	}
	rect(left, top, left+1, H-bottom, black)
	rect(left, H-bottom, W-right, H-bottom+1, black)
	text(left, 25, black, title)
	groupW := (W - left - right) / len(groups)
	barW := groupW / (len(ss) + 1)
	for gi, g := range groups {
		gx := left + gi*groupW + barW/2
		for si, s := range ss {
			if gi >= len(s.Vals) {
				continue
			}
			v := s.Vals[gi]
			x0 := gx + si*barW
			rect(x0+4, y(v.Median), x0+barW-4, H-bottom, s.Color)
			mid := x0 + barW/2
			rect(mid, y(v.Max), mid+1, y(v.Min)+1, black)
			rect(mid-6, y(v.Max), mid+7, y(v.Max)+1, black)
			rect(mid-6, y(v.Min), mid+7, y(v.Min)+1, black)
			label := fmt.Sprintf("%.0f", v.Median)
			text(mid-len(label)*7/2, y(v.Max)-6, black, label)
		}
		text(gx+len(ss)*barW/2-len(g)*7/2, H-bottom+20, black, g) // centred under the group's bars
	}
	lx := W - right - 260
	for si, s := range ss {
		rect(lx, 38+si*16, lx+12, 50+si*16, s.Color)
		text(lx+18, 49+si*16, black, s.Name)
	}
	text(left, H-12, black, "bars: median of runs; whiskers: min..max")
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}
