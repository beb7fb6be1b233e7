"""The chat's modal screens, one module each: model/memory info, settings, saved conversations."""

from .conversations import ConversationsScreen
from .info import InfoScreen, memory_plan_rows
from .settings import SettingsScreen

__all__ = ["ConversationsScreen", "InfoScreen", "SettingsScreen", "memory_plan_rows"]
