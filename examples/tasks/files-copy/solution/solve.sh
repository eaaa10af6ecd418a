#!/bin/bash
cp data.txt backup.txt
