"""What serving costs in dollars: GPUs rented by the hour, divided over the tokens they serve in it.

The price per GPU-hour is the user's (--gpu-hour-price) or the device profile's `price` section (a list price
with its source and date); without either, no dollars are reported, and the output says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from cost.profile import HardwareProfile


@dataclass(frozen=True)
class GpuPrice:
    usd_per_gpu_hour: float
    origin: str

    def of(self, gpus: int, output_tokens_per_s: float, total_tokens_per_s: float) -> dict:
        """$/hour of `gpus` GPUs and $ per million output and total tokens at those rates (None when nothing is
        served)."""
        per_hour = gpus * self.usd_per_gpu_hour

        def per_million(tokens_per_s: float) -> float | None:
            return per_hour / (tokens_per_s * 3600) * 1e6 if tokens_per_s > 0 else None

        return {"usd_per_hour": per_hour, "usd_per_million_output_tokens": per_million(output_tokens_per_s),
                "usd_per_million_total_tokens": per_million(total_tokens_per_s),
                "usd_per_gpu_hour": self.usd_per_gpu_hour}

    @property
    def note(self) -> str:
        return f"price: ${self.usd_per_gpu_hour:g} per GPU-hour ({self.origin})"


def gpu_price(hw: HardwareProfile, override_usd: float | None = None) -> GpuPrice | None:
    if override_usd is not None:
        return GpuPrice(override_usd, "--gpu-hour-price")
    if hw.gpu_hour_usd > 0:
        return GpuPrice(hw.gpu_hour_usd, f"{hw.name} profile: {hw.price_origin}; override with --gpu-hour-price")
    return None


NO_PRICE = "no dollars: the device profile states no price; give --gpu-hour-price USD"

__all__ = ["GpuPrice", "NO_PRICE", "gpu_price"]
