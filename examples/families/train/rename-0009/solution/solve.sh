#!/bin/bash
mv lines.txt final.txt
