// The texts of the page whose contrast is too low (tests/ui/test_browser_accessibility.py):
// WCAG 2.1's contrast (1.4.3) of each visible element's own text, input value or placeholder
// against what lies behind it: the first opaque background up its ancestors, with the
// translucent ones above it laid over. SVG text is its `fill`. Disabled controls are exempt, as
// WCAG has them; large text (24 px, or 18.66 px bold) needs 3:1, the rest 4.5:1.
() => {
  const parse = (text) => {
    const found = /rgba?\(([^)]*)\)/.exec(text || "");
    if (!found) return null;
    const parts = found[1].split(/[\s,\/]+/).filter(Boolean).map(Number);
    return [parts[0], parts[1], parts[2], parts.length > 3 ? parts[3] : 1];
  };
  const over = (top, below) => [0, 1, 2].map((i) => top[i] * top[3] + below[i] * (1 - top[3])).concat([1]);
  const behind = (element) => {
    const layers = [];
    for (let node = element; node; node = node.parentElement) {
      const colour = parse(getComputedStyle(node).backgroundColor);
      if (colour && colour[3] > 0) {
        layers.push(colour);
        if (colour[3] >= 1) break;
      }
    }
    return layers.reverse().reduce((below, layer) => over(layer, below), [255, 255, 255, 1]);
  };
  const luminance = (colour) => {
    const [r, g, b] = colour.slice(0, 3).map((value) => {
      const c = value / 255;
      return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const ratio = (a, b) => {
    const [light, dark] = [luminance(a), luminance(b)].sort((x, y) => y - x);
    return (light + 0.05) / (dark + 0.05);
  };
  const shown = (element) => element.getClientRects().length > 0 && element.checkVisibility(
    {opacityProperty: true, visibilityProperty: true, checkOpacity: true, checkVisibilityCSS: true});
  const failures = [];
  const check = (element, colour, what, text) => {
    if (!colour) return;
    const style = getComputedStyle(element);
    const background = behind(element);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && parseInt(style.fontWeight, 10) >= 700);
    const found = ratio(over(colour, background), background);
    if (found < (large ? 3 : 4.5)) {
      const name = element.tagName.toLowerCase() + (element.className && typeof element.className === "string"
        ? "." + element.className.trim().split(/\s+/).join(".") : "");
      failures.push(`${name} ${what} "${text.trim().slice(0, 40)}": ${found.toFixed(2)}:1,`
        + ` rgba(${colour.join(", ")}) on rgb(${background.slice(0, 3).map(Math.round).join(", ")})`);
    }
  };
  const fields = "input:not([type=checkbox]):not([type=radio]):not([type=hidden]), select, textarea";
  for (const element of document.body.querySelectorAll("*")) {
    if (!shown(element) || element.matches(":disabled")) continue;
    const style = getComputedStyle(element);
    const own = [...element.childNodes].filter((node) => node.nodeType === Node.TEXT_NODE)
      .map((node) => node.textContent).join("");
    if (own.trim()) {
      const colour = element instanceof SVGElement ? parse(style.fill) : parse(style.color);
      check(element, colour, "text", own);
    }
    if (element.matches(fields)) {
      if (element.value) {
        check(element, parse(style.color), "value", element.value);
      } else if (element.placeholder) {
        check(element, parse(getComputedStyle(element, "::placeholder").color), "placeholder", element.placeholder);
      }
    }
  }
  return failures;
}
